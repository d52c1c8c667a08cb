//! The CUDA kernels of `kernels/quant.cu` run on the host: `kernels/quant_emulation.cpp`
//! defines the CUDA built-ins for one sequential thread, runs every kernel over a small grid
//! and compares it with a per-element reference from `kernels/quant.cuh` (see that file). Runs
//! on any machine with a C++ compiler (`$CXX`, else `c++`), GPU or not; without one it prints
//! "skipped: no C++ compiler".

use std::process::Command;

#[test]
fn kernels_match_the_per_element_reference() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("quant_emulation");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
    let kernels = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels");
    let compiled = Command::new(&cxx)
        .args(["-std=c++17", "-O1", "-w", "-I", kernels])
        .arg(format!("{kernels}/quant_emulation.cpp"))
        .arg("-o")
        .arg(&exe)
        .status();
    match compiled {
        Err(e) => {
            println!("skipped: no C++ compiler ({cxx}: {e})");
            return;
        }
        Ok(status) => assert!(status.success(), "{cxx} failed on quant_emulation.cpp"),
    }
    let out = Command::new(&exe).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(out.status.success(), "emulated kernels differ:\n{stdout}");
    assert!(stdout.contains(" 0 failures"), "{stdout}");
}
