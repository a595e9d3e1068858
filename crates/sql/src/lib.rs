//! hawser-sql
