//! hawser's control plane.
pub mod state;
pub mod store;
pub mod types;
