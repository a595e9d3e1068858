//! hawser-store
