//! hawser's control plane.
pub mod state;
