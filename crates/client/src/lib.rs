//! hawser-client
