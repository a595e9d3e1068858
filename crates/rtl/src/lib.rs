//! hawser-rtl
