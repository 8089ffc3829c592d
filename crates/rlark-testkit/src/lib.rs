//! Test support: start an rlark server in-process on an ephemeral port.
