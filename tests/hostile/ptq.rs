//! Post-training quantization and its model files, and `compare`: requested formats that
//! cannot be evaluated or saved, an unwritable `--out`, and a bad `--plot` are refused
//! before any work is done or anything printed; model files with NaN or infinite weights,
//! format metadata that does not parse or does not match the dtype of the patterns, or
//! missing and misshapen tensors are refused naming the file, the tensor and what is wrong;
//! fixed point and 32-bit formats are saved and read back exactly; and mutated quantized
//! model files are read or refused, never a panic.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use candle_core::{DType, Device, Tensor};
use qcandle::io::{read_tensors, write_tensors};
use qcandle::nn::ModelKind;
use qcandle::ptq::{read_weights, write_quantized};
use qcandle::{Format, Rounding};

use super::Rng;
use crate::cli::{assert_clean_failure, qcandle, stderr, stdout};

/// An MLP trained for one epoch on 1024 images of the embedded subset (once per test
/// binary), by the tool itself: the run directory.
fn mlp_run() -> &'static Path {
    static RUN: OnceLock<(PathBuf, tempfile::TempDir)> = OnceLock::new();
    let (run, _) = RUN.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let run = dir.path().join("run");
        let o = qcandle(&[
            "train",
            "--model",
            "mlp",
            "--data",
            "embedded",
            "--train-limit",
            "1024",
            "--epochs",
            "1",
            "--quiet",
            "--out",
            run.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "training: {}", stderr(&o));
        (run, dir)
    });
    run
}

fn mlp_model() -> PathBuf {
    mlp_run().join("model.safetensors")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// Asserts that no method was evaluated (no progress line) and nothing printed.
#[track_caller]
fn assert_nothing_evaluated(o: &std::process::Output) {
    assert!(!stderr(o).contains("top-1"), "a method ran: {}", stderr(o));
    assert_eq!(stdout(o), "", "printed before failing");
}

#[test]
fn every_format_ptq_cannot_take_is_named_before_anything_is_evaluated_or_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let model = mlp_model();
    let mut args = vec!["ptq", "--model", s(&model)];
    for f in [
        "posit<8,0>",
        "block<8>",
        "posit<32,5>",
        "fixed<8,4,noclamp>",
        "e4m3",
        "posit<8,0>",
    ] {
        args.extend(["--format", f]);
    }
    args.extend(["--out", s(&out)]);
    let o = qcandle(&args);
    assert_clean_failure(
        &o,
        &[
            "block<8>",
            "rounds whole blocks",
            "posit<32,5>",
            "quire's range",
            "fixed<8,4,noclamp>",
            "cannot be saved",
            "posit<8,0>: given more than once",
        ],
    );
    // e4m3 is fine: no line names it as refused (the closing help may use it as an example).
    assert!(
        !stderr(&o)
            .lines()
            .any(|l| l.trim_start().starts_with("e4m3")),
        "e4m3 is fine: {}",
        stderr(&o)
    );
    assert_nothing_evaluated(&o);
    assert!(!out.exists(), "{} was created", out.display());
}

#[test]
fn fixed_point_is_evaluated_and_saved_as_twos_complement_integers_that_read_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = qcandle(&[
        "ptq",
        "--model",
        s(&mlp_model()),
        "--format",
        "fixed<8,4>",
        "--out",
        s(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("| fixed<8,4> naive | "),
        "{}",
        stdout(&o)
    );
    let saved = out.join("model-fixed_8_4.safetensors");
    for (name, t) in read_tensors(&saved).unwrap() {
        assert_eq!(t.dtype(), DType::U8, "{name}");
    }
    let original = read_weights(&mlp_model(), Some(ModelKind::Mlp)).unwrap();
    let back = read_weights(&saved, None).unwrap();
    let format: Format = "fixed<8,4>".parse().unwrap();
    assert_eq!(back.format, Some(format));
    for (name, t) in &original.tensors {
        let want: Vec<f64> = values(t)
            .into_iter()
            .map(|v| format.round(v, Rounding::NearestEven, 0))
            .collect();
        assert_eq!(values(&back.tensors[name]), want, "{name}");
    }
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

#[test]
fn thirty_two_bit_patterns_read_back_to_exactly_the_values_they_encode() {
    // Weights with more significant bits than f32 holds (each trained weight nudged by a
    // relative 2^-26 in f64), so that their posit<32,2> and fixed<32,30> patterns do too:
    // values read back through f32 would move.
    let dir = tempfile::tempdir().unwrap();
    let mut weights = read_weights(&mlp_model(), Some(ModelKind::Mlp)).unwrap();
    for t in weights.tensors.values_mut() {
        let wide = t.to_dtype(DType::F64).unwrap();
        *t = (&wide + (&wide * 2f64.powi(-26)).unwrap()).unwrap();
    }
    for f in ["posit<32,2>", "fixed<32,30>"] {
        let format: Format = f.parse().unwrap();
        let path = dir.path().join("wide.safetensors");
        write_quantized(&path, &weights, &format).unwrap();
        let back = read_weights(&path, None).unwrap();
        let mut beyond_f32 = 0;
        for (name, t) in &weights.tensors {
            let want: Vec<f64> = values(t)
                .into_iter()
                .map(|v| format.round(v, Rounding::NearestEven, 0))
                .collect();
            beyond_f32 += want.iter().filter(|&&v| v as f32 as f64 != v).count();
            assert_eq!(values(&back.tensors[name]), want, "{f}: {name}");
        }
        assert!(
            beyond_f32 > 1000,
            "{f}: only {beyond_f32} values need more than f32"
        );
    }
}

#[test]
fn an_unwritable_out_is_refused_before_anything_is_evaluated() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let mut outs = vec![file.join("sub"), file.clone()];
    // A location no one may write in, root included (tests may run as root).
    if Path::new("/proc/self").is_dir() {
        outs.push(PathBuf::from("/proc/self"));
    }
    for out in outs {
        let o = qcandle(&["ptq", "--model", s(&mlp_model()), "--out", s(&out)]);
        assert_clean_failure(&o, &[s(&out), "output directory"]);
        assert_nothing_evaluated(&o);
    }
    assert_eq!(std::fs::read(&file).unwrap(), b"not a directory");
}

/// The trained MLP's tensors with `edit` applied to the named one, written to `path`.
fn edited_model(path: &Path, name: &str, edit: impl Fn(&Tensor) -> Tensor) {
    let tensors: Vec<(String, Tensor)> = read_tensors(&mlp_model())
        .unwrap()
        .into_iter()
        .map(|(n, t)| {
            let t = if n == name { edit(&t) } else { t };
            (n, t)
        })
        .collect();
    write_tensors(path, &tensors).unwrap();
}

/// `t` with the first elements replaced by `values`.
fn with_first(t: &Tensor, values: &[f32]) -> Tensor {
    let mut v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    v[..values.len()].copy_from_slice(values);
    Tensor::from_vec(v, t.dims(), &Device::Cpu).unwrap()
}

#[test]
fn non_finite_weights_are_refused_naming_each_tensor_and_its_counts() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("diverged.safetensors");
    let tensors: Vec<(String, Tensor)> = read_tensors(&mlp_model())
        .unwrap()
        .into_iter()
        .map(|(n, t)| {
            let t = match n.as_str() {
                "fc1.weight" => with_first(
                    &t,
                    &[f32::NAN, f32::NAN, f32::NAN, f32::INFINITY, -f32::INFINITY],
                ),
                "fc3.bias" => with_first(&t, &[f32::NAN]),
                _ => t,
            };
            (n, t)
        })
        .collect();
    write_tensors(&model, &tensors).unwrap();
    let out = dir.path().join("out");
    let o = qcandle(&[
        "ptq",
        "--model",
        s(&model),
        "--arch",
        "mlp",
        "--data",
        "embedded",
        "--out",
        s(&out),
    ]);
    assert_clean_failure(
        &o,
        &[
            "diverged.safetensors",
            "`fc1.weight` holds 3 NaN and 2 infinite of its 200704 values",
            "`fc3.bias` holds 1 NaN and 0 infinite of its 10 values",
        ],
    );
    assert!(!stderr(&o).contains("fc2"), "{}", stderr(&o));
    assert_nothing_evaluated(&o);
    assert!(!out.exists());
}

/// Writes `tensors` to `path` with `metadata`.
fn write_with_metadata(path: &Path, tensors: &[(String, Tensor)], metadata: &[(&str, &str)]) {
    let metadata: HashMap<String, String> = metadata
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    safetensors::serialize_to_file(
        tensors.iter().map(|(n, t)| (n.as_str(), t)),
        Some(metadata),
        path,
    )
    .unwrap();
}

#[test]
fn format_metadata_must_parse_and_match_the_dtype_of_the_patterns() {
    let dir = tempfile::tempdir().unwrap();
    let posit_8_0 = dir.path().join("posit_8_0.safetensors");
    let weights = read_weights(&mlp_model(), Some(ModelKind::Mlp)).unwrap();
    write_quantized(&posit_8_0, &weights, &"posit<8,0>".parse().unwrap()).unwrap();
    let patterns = read_tensors(&posit_8_0).unwrap();
    let floats = read_tensors(&mlp_model()).unwrap();
    type Case<'a> = (&'a str, &'a [(String, Tensor)], &'a [&'a str]);
    let cases: [Case; 5] = [
        ("posit<16,1>", &patterns, &["posit<16,1>", "I16", "U8"]),
        ("fp16", &patterns, &["fp16", "I16", "U8"]),
        ("posit<8,0>", &floats, &["posit<8,0>", "U8", "F32"]),
        (
            "posit<99>",
            &patterns,
            &["\"posit<99>\"", "does not name a format"],
        ),
        ("block<8>", &patterns, &["\"block<8>\"", "no pattern"]),
    ];
    for (i, (label, tensors, words)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("relabelled-{i}.safetensors"));
        write_with_metadata(
            &path,
            tensors,
            &[("qcandle.format", label), ("qcandle.model", "mlp")],
        );
        let o = qcandle(&[
            "ptq",
            "--model",
            s(&path),
            "--data",
            "embedded",
            "--out",
            s(&dir.path().join("out")),
        ]);
        let mut expected = vec![s(&path), "qcandle.format"];
        expected.extend_from_slice(words);
        assert_clean_failure(&o, &expected);
        assert_nothing_evaluated(&o);
    }
    let path = dir.path().join("unknown-model.safetensors");
    write_with_metadata(
        &path,
        &patterns,
        &[
            ("qcandle.format", "posit<8,0>"),
            ("qcandle.model", "resnet"),
        ],
    );
    let o = qcandle(&["ptq", "--model", s(&path), "--data", "embedded"]);
    assert_clean_failure(&o, &[s(&path), "qcandle.model", "\"resnet\""]);
}

#[test]
fn missing_and_misshapen_tensors_name_the_tensor_and_both_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.safetensors");
    let tensors: Vec<(String, Tensor)> = read_tensors(&mlp_model())
        .unwrap()
        .into_iter()
        .filter(|(n, _)| n != "fc2.bias")
        .collect();
    write_tensors(&missing, &tensors).unwrap();
    let o = qcandle(&[
        "ptq",
        "--model",
        s(&missing),
        "--arch",
        "mlp",
        "--data",
        "embedded",
    ]);
    assert_clean_failure(&o, &[s(&missing), "missing", "fc2.bias (shape [128])"]);

    let misshapen = dir.path().join("misshapen.safetensors");
    edited_model(&misshapen, "fc2.weight", |t| t.narrow(1, 0, 255).unwrap());
    let o = qcandle(&[
        "ptq",
        "--model",
        s(&misshapen),
        "--arch",
        "mlp",
        "--data",
        "embedded",
    ]);
    assert_clean_failure(
        &o,
        &[s(&misshapen), "`fc2.weight`", "[128, 255]", "[128, 256]"],
    );
}

#[test]
fn mutated_quantized_model_files_are_read_or_refused_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let weights = read_weights(&mlp_model(), Some(ModelKind::Mlp)).unwrap();
    let mut rng = Rng::new(0x9e37_79b9);
    let (mut read, mut refused, mut tried) = (0, 0, 0);
    for format in [
        "posit<8,0>",
        "fixed<6,3,sym>",
        "posit<16,1>",
        "mxfp4_e2m1",
        "nvfp4",
    ] {
        let format: Format = format.parse().unwrap();
        let valid = dir.path().join("valid.safetensors");
        write_quantized(&valid, &weights, &format).unwrap();
        let bytes = std::fs::read(&valid).unwrap();
        let header_end = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let path = dir.path().join("mutated.safetensors");
        for i in 0..150 {
            // Mostly the header (names, dtypes, shapes, offsets, metadata); now and then
            // the pattern bytes.
            let mutated = if i % 5 == 4 {
                rng.mutate(&bytes)
            } else {
                let mut m = rng.mutate(&bytes[..header_end]);
                m.extend_from_slice(&bytes[header_end..]);
                m
            };
            std::fs::write(&path, &mutated).unwrap();
            tried += 1;
            match read_weights(&path, None) {
                Ok(w) => {
                    read += 1;
                    for (name, t) in &w.tensors {
                        assert!(values(t).iter().all(|v| v.is_finite()), "{name}");
                    }
                }
                Err(e) => {
                    refused += 1;
                    let message = format!("{e:#}");
                    assert!(message.contains("mutated.safetensors"), "{message}");
                }
            }
        }
    }
    println!("quantized model files: {tried} mutated, {read} read, {refused} refused");
    assert!(
        refused > tried / 4,
        "too few mutations were caught: {refused} of {tried}"
    );
}

#[test]
fn ptq_and_train_refuse_an_output_path_that_is_a_file_in_the_same_words() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let words = format!("the output directory {} is not a directory", file.display());
    let ptq = qcandle(&["ptq", "--model", s(&mlp_model()), "--out", s(&file)]);
    let train = qcandle(&[
        "train",
        "--data",
        "embedded",
        "--epochs",
        "1",
        "--out",
        s(&file),
    ]);
    for o in [ptq, train] {
        assert_clean_failure(&o, &[&words]);
    }
}

#[test]
fn compare_checks_the_plot_path_before_printing_anything() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let cases = [
        (dir.path().to_path_buf(), vec!["is a directory", ".png"]),
        (dir.path().join("curves.jpg"), vec!["curves.jpg", ".png"]),
        (dir.path().join("curves"), vec!["curves", ".png"]),
        (file.join("curves.png"), vec!["a-file", "output directory"]),
    ];
    for (plot, words) in cases {
        let o = qcandle(&["compare", s(mlp_run()), "--plot", s(&plot)]);
        assert_clean_failure(&o, &words);
        assert_eq!(
            stdout(&o),
            "",
            "--plot {}: printed before failing",
            plot.display()
        );
    }
}

#[test]
fn compare_names_a_directory_without_run_json_and_prints_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("not-a-run");
    std::fs::create_dir(&empty).unwrap();
    let o = qcandle(&["compare", s(mlp_run()), s(&empty)]);
    assert_clean_failure(&o, &[s(&empty), "run.json"]);
    assert_eq!(stdout(&o), "", "printed before failing");
    let absent = dir.path().join("absent");
    let o = qcandle(&["compare", s(mlp_run()), s(&absent)]);
    assert_clean_failure(&o, &[s(&absent), "no such run directory"]);
    assert_eq!(stdout(&o), "");
}
