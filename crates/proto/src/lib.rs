//! hawser-proto
