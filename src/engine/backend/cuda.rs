//! CUDA backend (being written)
