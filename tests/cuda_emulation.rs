//! The CUDA kernels of `cuda/quant.cu` run on the host: `cuda/quant_emulation.cpp`
//! defines the CUDA built-ins for one sequential thread, runs every kernel over a small grid
//! and compares it with a per-element reference from `cuda/quant.cuh` (see that file). Runs
//! on any machine with a C++ compiler (`$CXX`, else `c++`), GPU or not; without one it prints
//! "skipped: no C++ compiler".

use std::process::Command;

#[test]
fn kernels_match_the_per_element_reference() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = compile("quant_emulation", dir.path()) else {
        return;
    };
    let out = Command::new(&exe).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(out.status.success(), "emulated kernels differ:\n{stdout}");
    assert!(stdout.contains(" 0 failures"), "{stdout}");
}

mod common;

use candle_core::{Device, Tensor};
use common::SplitMix;
use qcandle::quire::gemm_cpu::OpTables;
use qcandle::quire::{linear, naive_matmul, quire_matmul, Accumulation};
use qcandle::Format;

/// One GEMM for `cuda/gemm_emulation.cpp`: `A (batch, m, k) · B (batch or 1, k, n)
/// [+ bias (n)]`, as a matmul or (with a bias) a linear layer whose weight is `B^T`.
struct GemmCase {
    format: &'static str,
    naive: bool,
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
    shared_b: bool,
    a: Vec<f32>,
    b: Vec<f32>,
    bias: Option<Vec<f32>>,
}

impl GemmCase {
    /// Random operands around the format's range (log-uniform from below minpos to above
    /// maxpos, short mantissas for ties, zeros); `specials` puts NaN and ±Inf into one row of
    /// A, one column of B and the bias.
    #[allow(clippy::too_many_arguments)]
    fn new(
        format: &'static str,
        naive: bool,
        (batch, m, k, n): (usize, usize, usize, usize),
        shared_b: bool,
        bias: bool,
        specials: bool,
        rng: &mut SplitMix,
    ) -> Self {
        let s = match format.parse::<Format>().unwrap() {
            Format::Posit(p) => p.max_scale(),
            _ => unreachable!(),
        };
        let value = |rng: &mut SplitMix| -> f32 {
            match rng.below(10) {
                0 => 0.0,
                1 | 2 => {
                    let e = rng.below(2 * s as u64 + 2) as i32 - s - 1;
                    let m = (1 + rng.below(8)) as f32 / 4.0;
                    let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
                    sign * m * 2f32.powi(e)
                }
                _ => rng.float_between(-s - 3, s + 3) as f32,
            }
        };
        let b_items = if shared_b { 1 } else { batch };
        let mut a: Vec<f32> = (0..batch * m * k).map(|_| value(rng)).collect();
        let mut b: Vec<f32> = (0..b_items * k * n).map(|_| value(rng)).collect();
        let mut bias = bias.then(|| (0..n).map(|_| value(rng)).collect::<Vec<f32>>());
        if specials && m > 2 && n > 2 && k > 0 {
            a[k + k / 2] = f32::NAN; // row 1
            a[(m - 1) * k] = f32::NEG_INFINITY; // last row
            b[(k - 1) * n + n - 1] = f32::INFINITY; // last column
            if let Some(bias) = bias.as_mut() {
                bias[n / 2] = -f32::NAN;
            }
        }
        GemmCase {
            format,
            naive,
            batch,
            m,
            k,
            n,
            shared_b,
            a,
            b,
            bias,
        }
    }

    /// The case in the emulator's input layout (see `cuda/gemm_emulation.cpp`).
    fn write(&self, out: &mut Vec<u8>) {
        let Format::Posit(p) = self.format.parse::<Format>().unwrap() else {
            unreachable!()
        };
        let header = [
            self.naive as u32,
            p.n(),
            p.es(),
            self.batch as u32,
            self.m as u32,
            self.k as u32,
            self.n as u32,
            self.shared_b as u32,
            self.bias.is_some() as u32,
        ];
        header
            .iter()
            .for_each(|h| out.extend_from_slice(&h.to_le_bytes()));
        let floats = self
            .a
            .iter()
            .chain(&self.b)
            .chain(self.bias.iter().flatten());
        floats.for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        if self.naive {
            let tables = OpTables::get(&Format::Posit(p)).unwrap();
            out.extend_from_slice(&tables.mul);
            out.extend_from_slice(&tables.add);
        }
    }

    /// The CPU op's result, flattened.
    fn expected(&self) -> anyhow::Result<Vec<f32>> {
        let format: Format = self.format.parse()?;
        let (batch, m, k, n) = (self.batch, self.m, self.k, self.n);
        let cpu = &Device::Cpu;
        let acc = if self.naive {
            Accumulation::Naive
        } else {
            Accumulation::Quire
        };
        let out = match &self.bias {
            Some(bias) => {
                assert!(batch == 1);
                let x = Tensor::from_vec(self.a.clone(), (m, k), cpu)?;
                let w = Tensor::from_vec(self.b.clone(), (k, n), cpu)?
                    .t()?
                    .contiguous()?;
                let bias = Tensor::from_vec(bias.clone(), n, cpu)?;
                linear(&x, &w, Some(&bias), &format, acc)?
            }
            None => {
                let a = Tensor::from_vec(self.a.clone(), (batch, m, k), cpu)?;
                let b = if self.shared_b {
                    Tensor::from_vec(self.b.clone(), (k, n), cpu)?
                } else {
                    Tensor::from_vec(self.b.clone(), (batch, k, n), cpu)?
                };
                if self.naive {
                    naive_matmul(&a, &b, &format)?
                } else {
                    quire_matmul(&a, &b, &format)?
                }
            }
        };
        Ok(out.flatten_all()?.to_vec1::<f32>()?)
    }
}

/// Compiles `cuda/<name>.cpp` as C++20 (std::barrier); None (skip) without a compiler.
fn compile(name: &str, dir: &std::path::Path) -> Option<std::path::PathBuf> {
    let exe = dir.join(name);
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
    let cuda = concat!(env!("CARGO_MANIFEST_DIR"), "/cuda");
    let compiled = Command::new(&cxx)
        .args(["-std=c++20", "-O1", "-w", "-pthread", "-I", cuda])
        .arg(format!("{cuda}/{name}.cpp"))
        .arg("-o")
        .arg(&exe)
        .status();
    match compiled {
        Err(e) => {
            println!("skipped: no C++ compiler ({cxx}: {e})");
            None
        }
        Ok(status) => {
            assert!(status.success(), "{cxx} failed on {name}.cpp");
            Some(exe)
        }
    }
}

#[test]
fn gemm_kernels_match_the_cpu_ops() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let Some(exe) = compile("gemm_emulation", dir.path()) else {
        return Ok(());
    };
    let mut rng = SplitMix(0x5EED_6E77);
    let mut cases = Vec::new();
    let formats = [
        "posit<8,0>",
        "posit<8,1>",
        "posit<8,2>",
        "posit<6,1>",
        "posit<7,2>",
    ];
    for format in formats {
        for naive in [false, true] {
            // (batch, m, k, n), shared b, bias, specials
            let shapes = [
                ((1, 67, 45, 70), false, false, false), // 2 x 2 tiles, ragged, 2 k-tiles
                ((1, 67, 45, 70), false, false, true),  // NaN / ±Inf rows and columns
                ((1, 1, 1, 1), false, false, false),
                ((1, 5, 1, 130), false, false, true), // k = 1, 3 column tiles
                ((1, 3, 4000, 5), false, false, true), // long k: 125 k-tiles
                ((3, 2, 33, 65), true, false, false), // batched, shared b
                ((2, 7, 3, 3), false, false, true),   // batched b
                ((1, 33, 70, 66), false, true, true), // linear with bias
                ((1, 4, 0, 3), false, false, false),  // k = 0
            ];
            for (dims, shared_b, bias, specials) in shapes {
                let case = GemmCase::new(format, naive, dims, shared_b, bias, specials, &mut rng);
                cases.push(case);
            }
        }
    }
    // Sums just above and below a tie of posit<8,2> (36, between 32 and 40) by minpos^2 =
    // 2^-48: 36 · 2^48 >= 2^53 units, so the f64 rounded to odd must keep the sticky bit.
    let tiny = 2f32.powi(-24);
    for naive in [false, true] {
        cases.push(GemmCase {
            format: "posit<8,2>",
            naive,
            batch: 1,
            m: 2,
            k: 2,
            n: 1,
            shared_b: false,
            a: vec![6.0, tiny, -6.0, tiny],
            b: vec![6.0, tiny],
            bias: None,
        });
    }
    // Long sums of maxpos^2 of one sign (posit<8,0>: 200 · 2^24 units > 2^31, beyond an i32),
    // and the same cancelled down to a small remainder.
    for (format, maxpos) in [
        ("posit<8,0>", 64f32),
        ("posit<8,1>", 4096.0),
        ("posit<8,2>", 16777216.0),
    ] {
        let k = 201;
        let a: Vec<f32> = (0..k).map(|t| if t < 200 { maxpos } else { 0.5 }).collect();
        let b: Vec<f32> = (0..k)
            .flat_map(|t| match t {
                200 => [0.5, 0.5],
                t if t % 2 == 0 => [maxpos, maxpos],
                _ => [maxpos, -maxpos],
            })
            .collect();
        for naive in [false, true] {
            cases.push(GemmCase {
                format,
                naive,
                batch: 1,
                m: 1,
                k,
                n: 2,
                shared_b: false,
                a: a.clone(),
                b: b.clone(),
                bias: None,
            });
        }
    }
    let mut input = Vec::new();
    cases.iter().for_each(|c| c.write(&mut input));
    let (inp, outp) = (dir.path().join("in.bin"), dir.path().join("out.bin"));
    std::fs::write(&inp, input)?;
    let run = Command::new(&exe).arg(&inp).arg(&outp).output()?;
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "gemm_emulation failed: {stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let bytes = std::fs::read(&outp)?;
    let got: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let mut at = 0;
    let mut checked = 0u64;
    let mut mismatches = common::Mismatches::default();
    for c in &cases {
        let want = c.expected()?;
        let what = format!(
            "{} {} batch {} m {} k {} n {}{}",
            c.format,
            if c.naive { "naive" } else { "quire" },
            c.batch,
            c.m,
            c.k,
            c.n,
            if c.bias.is_some() { " bias" } else { "" }
        );
        assert!(at + want.len() <= got.len(), "{what}: output too short");
        for (i, w) in want.iter().enumerate() {
            let g = got[at + i];
            mismatches.check(g == w.to_bits(), || {
                format!(
                    "{what}: element {i}: cpu {w} ({:#x}), emulated {} ({g:#x})",
                    w.to_bits(),
                    f32::from_bits(g)
                )
            });
        }
        checked += want.len() as u64;
        at += want.len();
    }
    assert_eq!(at, got.len(), "output length");
    mismatches.assert_none_of("emulated GEMM kernels vs CPU ops", checked);
    Ok(())
}
