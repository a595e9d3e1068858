//! hawser-node
