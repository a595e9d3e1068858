//! Helpers for end-to-end tests that start real `hawser` processes.
