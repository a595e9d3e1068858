//! hawser-scheme
