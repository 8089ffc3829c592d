//! The rlark control-plane process.
