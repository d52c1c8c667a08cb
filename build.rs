//! Build script. CPU-only builds need nothing from it; the CUDA kernels in `kernels/*.cu`
//! are compiled to PTX here once the `cuda` feature has device code to build.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=kernels");
}
