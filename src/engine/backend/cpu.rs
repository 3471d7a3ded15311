//! CPU backend (being written)
