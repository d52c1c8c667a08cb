//! See the crate docs of this test file (main.rs).
