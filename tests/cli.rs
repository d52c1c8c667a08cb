//! The `qcandle` command line: `formats`, `quantize` on .npy and .safetensors files (names
//! kept, integer tensors copied, output written atomically), `demo`, and clear errors (exit
//! status 1 with a message, never a panic) for bad formats, missing, corrupt and unsupported
//! files.

#[path = "common/cli.rs"]
mod cli;

use std::collections::HashMap;
use std::path::Path;
use std::process::Output;

use candle_core::{DType, Device, Tensor};
use cli::{assert_clean_failure, command, qcandle, qcandle_in, stderr};
use qcandle::{quantize, Quant};

fn sample() -> Tensor {
    let v: Vec<f32> = (0..60).map(|i| (i as f32 - 30.0) * 0.173).collect();
    Tensor::from_vec(v, (6, 10), &Device::Cpu).unwrap()
}

/// Asserts that the tool, run with `args`, refused them as a user error (status 1, or clap's
/// usage status 2) whose message contains `needle`, without a panic.
#[track_caller]
fn assert_refused(o: &Output, args: &[&str], needle: &str) {
    assert!(
        matches!(o.status.code(), Some(1 | 2)),
        "{args:?}: {}",
        stderr(o)
    );
    assert!(stderr(o).contains(needle), "{args:?}: {}", stderr(o));
    assert!(!stderr(o).contains("panicked"), "{args:?}");
}

#[test]
fn formats_lists_every_preset_with_its_range() {
    let o = qcandle(&["formats"]);
    assert!(o.status.success());
    let out = String::from_utf8(o.stdout).unwrap();
    for (name, _, format) in qcandle::Format::presets() {
        let line = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name} missing from\n{out}"));
        match format.max_finite() {
            Some(max) => assert!(line.contains(&format!("{max:.4e}")), "{line}"),
            // Block-scaled presets (MX, NVFP4): the range depends on the block's scale.
            None => assert_eq!(line.split_whitespace().nth(3), Some("-"), "{line}"),
        }
    }
}

#[test]
fn formats_spells_every_format_as_it_displays_and_parses_back() {
    let o = qcandle(&["formats"]);
    assert!(o.status.success());
    let out = String::from_utf8(o.stdout).unwrap();
    let mut rows = 0;
    for line in out.lines().skip(1) {
        let spelling = line.split_whitespace().nth(1).expect("a format column");
        let format: qcandle::Format = spelling
            .parse()
            .unwrap_or_else(|e| panic!("{spelling}: {e}"));
        assert_eq!(format.to_string(), spelling, "{line}");
        rows += 1;
    }
    for (name, _, format) in qcandle::Format::presets() {
        let line = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name} missing from\n{out}"));
        assert_eq!(
            line.split_whitespace().nth(1),
            Some(format.to_string().as_str()),
            "{line}"
        );
    }
    assert!(rows > qcandle::Format::presets().len(), "{out}");
}

#[test]
fn quantize_npy_equals_the_library_op() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("w.npy"), dir.path().join("q.npy"));
    sample().write_npy(&input).unwrap();
    let o = qcandle(&[
        "quantize",
        "--format",
        "posit<8,0>",
        input.to_str().unwrap(),
        output.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = Tensor::read_npy(&output).unwrap();
    let want = quantize(&sample(), &Quant::new("posit<8,0>".parse().unwrap())).unwrap();
    assert_eq!(
        got.to_vec2::<f32>().unwrap(),
        want.to_vec2::<f32>().unwrap()
    );
    // Nothing but the output is left in the directory (the temporary file was renamed).
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
}

#[test]
fn quantize_safetensors_keeps_names_and_integer_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (
        dir.path().join("m.safetensors"),
        dir.path().join("q.safetensors"),
    );
    let ids = Tensor::new(&[1u32, 2, 300], &Device::Cpu).unwrap();
    let mut map = HashMap::new();
    map.insert("layer.weight".to_string(), sample());
    map.insert(
        "layer.bias".to_string(),
        sample()
            .narrow(0, 0, 1)
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap(),
    );
    map.insert("ids".to_string(), ids.clone());
    candle_core::safetensors::save(&map, &input).unwrap();
    let o = qcandle(&[
        "quantize",
        "--format",
        "e4m3",
        "--rounding",
        "stochastic:8",
        "--seed",
        "5",
        input.to_str().unwrap(),
        output.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = candle_core::safetensors::load(&output, &Device::Cpu).unwrap();
    assert_eq!(got.len(), 3);
    assert_eq!(
        got["ids"].to_vec1::<u32>().unwrap(),
        ids.to_vec1::<u32>().unwrap()
    );
    assert_eq!(got["layer.bias"].dtype(), DType::F64);
    let e4m3: qcandle::Format = "e4m3".parse().unwrap();
    for v in got["layer.weight"]
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
    {
        assert_eq!(
            e4m3.round(v as f64, Default::default(), 0),
            v as f64,
            "{v} is not an e4m3 value"
        );
    }
}

fn fails_with(args: &[&str], needle: &str) {
    assert_clean_failure(&qcandle(args), &[needle]);
}

#[test]
fn bad_inputs_are_errors_that_say_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    sample().write_npy(p("ok.npy")).unwrap();
    std::fs::write(p("corrupt.npy"), b"\x93NUMPY garbage").unwrap();
    std::fs::write(
        p("corrupt.safetensors"),
        b"\x08\x00\x00\x00\x00\x00\x00\x00{nope}",
    )
    .unwrap();
    std::fs::write(p("x.csv"), b"1,2").unwrap();
    let o = qcandle(&[
        "quantize",
        "--format",
        "posit<40,2>",
        &p("ok.npy"),
        &p("o.npy"),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("`n`"), "{}", stderr(&o));
    fails_with(
        &[
            "quantize",
            "--format",
            "e4m3",
            &p("missing.npy"),
            &p("o.npy"),
        ],
        "no such file",
    );
    fails_with(
        &[
            "quantize",
            "--format",
            "e4m3",
            &p("corrupt.npy"),
            &p("o.npy"),
        ],
        "corrupt.npy",
    );
    fails_with(
        &[
            "quantize",
            "--format",
            "e4m3",
            &p("corrupt.safetensors"),
            &p("o.safetensors"),
        ],
        "corrupt.safetensors",
    );
    fails_with(
        &["quantize", "--format", "e4m3", &p("x.csv"), &p("o.npy")],
        "unsupported file type",
    );
    assert!(
        !Path::new(&p("o.npy")).exists(),
        "no output is written on failure"
    );
}

#[test]
fn demo_reports_every_preset_two_trained_accuracies_and_the_posit_8_0_ptq_table() {
    let o = qcandle(&["demo", "--samples", "4096", "--epochs", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    for (name, _, _) in qcandle::Format::presets() {
        assert!(
            out.contains(&format!("| {name} | nearest-even |")),
            "{name}"
        );
        assert!(out.contains(&format!("| {name} | stochastic |")), "{name}");
    }
    for config in ["float32", "posit<16,1>"] {
        let training = out
            .split("| config | train loss")
            .nth(1)
            .expect("a training table");
        let line = training
            .lines()
            .find(|l| l.starts_with(&format!("| {config} |")))
            .unwrap_or_else(|| panic!("no {config} row in\n{out}"));
        let top1: f64 = line
            .split('|')
            .nth(3)
            .unwrap()
            .trim()
            .trim_end_matches('%')
            .parse()
            .unwrap();
        assert!(top1 > 50.0, "{line}");
    }
    let ptq = out
        .split("Post-training quantization")
        .nth(1)
        .expect("a post-training quantization table");
    for method in [
        "float32",
        "float16",
        "int8",
        "posit<8,0> naive",
        "posit<8,0> quire",
    ] {
        assert!(ptq.contains(&format!("| {method} | ")), "{method}: {ptq}");
    }
}

#[test]
fn train_writes_a_run_that_compare_reads_and_a_second_call_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let out_s = out.to_str().unwrap();
    let args = [
        "train",
        "--model",
        "mlp",
        "--data",
        "embedded",
        "--train-limit",
        "512",
        "--config",
        "posit<16,1>",
        "--epochs",
        "1",
        "--batch",
        "64",
        "--quiet",
        "--out",
        out_s,
    ];
    let o = qcandle(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let csv = String::from_utf8(o.stdout.clone()).unwrap();
    assert!(
        csv.starts_with("epoch,train_loss,test_loss,top1,top5,seconds\n1,"),
        "{csv}"
    );
    assert!(
        stderr(&o).contains("peak resident memory"),
        "{}",
        stderr(&o)
    );
    let mut more = args.to_vec();
    more[10] = "2";
    let o = qcandle(&more);
    assert!(o.status.success(), "{}", stderr(&o));
    let csv = String::from_utf8(o.stdout).unwrap();
    assert_eq!(csv.lines().count(), 3, "{csv}");
    let first = csv
        .lines()
        .nth(1)
        .unwrap()
        .rsplit_once(',')
        .unwrap()
        .0
        .to_string();
    assert!(std::fs::read_to_string(out.join("metrics.csv"))
        .unwrap()
        .contains(&first));
    let png = dir.path().join("c.png");
    let o = qcandle(&["compare", out_s, "--plot", png.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = String::from_utf8(o.stdout).unwrap();
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("| run | posit<16,1> | 2 |")),
        "{table}"
    );
    assert!(png.is_file());
}

/// Runs `qcandle train` of a small MLP in `dir` (default `--out`) with `extra` arguments;
/// returns its stdout, the metrics CSV.
fn train_csv(dir: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "train",
        "--model",
        "mlp",
        "--data",
        "embedded",
        "--train-limit",
        "256",
        "--epochs",
        "1",
        "--batch",
        "64",
        "--quiet",
    ];
    args.extend(extra);
    let o = qcandle_in(Some(dir), &args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    String::from_utf8(o.stdout).unwrap()
}

/// [`train_csv`] without the seconds column (the last).
fn train_in(dir: &Path, extra: &[&str]) -> String {
    let csv = train_csv(dir, extra);
    let without_seconds = csv.lines().map(|l| l.rsplit_once(',').unwrap().0);
    without_seconds.collect::<Vec<_>>().join("\n")
}

/// The seed that the run.json in `run` records.
fn recorded_seed(run: &Path) -> u64 {
    let text = std::fs::read_to_string(run.join("run.json")).unwrap();
    let record: serde_json::Value = serde_json::from_str(&text).unwrap();
    record["options"]["seed"].as_u64().expect("a seed")
}

#[test]
fn train_takes_the_config_seed_unless_the_seed_flag_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let with_seed = dir.path().join("seeded.toml");
    let without_seed = dir.path().join("plain.toml");
    let body = "gradient = { format = \"posit<16,1>\", rounding = \"stochastic\" }\n";
    std::fs::write(&with_seed, format!("seed = 7\n{body}")).unwrap();
    std::fs::write(&without_seed, body).unwrap();
    let (seeded, plain) = (with_seed.to_str().unwrap(), without_seed.to_str().unwrap());

    let from_config = train_in(dir.path(), &["--config", seeded]);
    let from_flag = train_in(dir.path(), &["--config", plain, "--seed", "7"]);
    assert_eq!(from_config, from_flag, "config seed 7 trains like --seed 7");
    let runs = dir.path().join("runs");
    assert_eq!(recorded_seed(&runs.join("mlp-embedded-seeded-s7")), 7);
    assert_eq!(recorded_seed(&runs.join("mlp-embedded-plain-s7")), 7);

    let overridden = train_in(dir.path(), &["--config", seeded, "--seed", "3"]);
    let flag_only = train_in(dir.path(), &["--config", plain, "--seed", "3"]);
    assert_eq!(overridden, flag_only, "--seed 3 replaces the config's seed");
    assert_ne!(overridden, from_config, "seeds 3 and 7 train differently");
    assert_eq!(recorded_seed(&runs.join("mlp-embedded-seeded-s3")), 3);

    let neither = train_in(dir.path(), &["--config", plain]);
    let zero = train_in(dir.path(), &["--config", plain, "--seed", "0"]);
    assert_eq!(
        neither, zero,
        "without a flag or a config seed the seed is 0"
    );
    assert!(runs
        .join("mlp-embedded-plain-s0")
        .join("run.json")
        .is_file());
}

#[test]
fn a_format_string_config_names_its_default_run_directory_without_brackets() {
    let dir = tempfile::tempdir().unwrap();
    train_in(dir.path(), &["--config", "posit<16,1>"]);
    train_in(dir.path(), &["--config", "posit16"]);
    let runs = dir.path().join("runs");
    assert!(runs.join("mlp-embedded-posit_16_1-s0/run.json").is_file());
    assert!(runs.join("mlp-embedded-posit16-s0/run.json").is_file());
}

#[test]
fn train_and_compare_refuse_bad_input_with_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nothing");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["train", "--model", "resnet"], "unknown model `resnet`"),
        (vec!["train", "--data", "cifar"], "cifar"),
        (
            vec!["train", "--data", "embedded", "--config", "posit12"],
            "posit12",
        ),
        (
            vec![
                "train",
                "--data",
                "mnist",
                "--data-dir",
                missing.to_str().unwrap(),
            ],
            "nothing",
        ),
        (vec!["train", "--optimizer", "lion"], "lion"),
        (vec!["compare", missing.to_str().unwrap()], "run.json"),
    ];
    for (args, needle) in cases {
        let o = qcandle(&args);
        // 1: our errors; 2: clap's usage errors.
        assert_refused(&o, &args, needle);
    }
}

/// The rows of a markdown table in `out` as (first cell, second cell).
fn table_rows(out: &str) -> Vec<(String, String)> {
    out.lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| method"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells[1].to_string(), cells[2].to_string())
        })
        .collect()
}

#[test]
fn ptq_evaluates_a_trained_run_saves_the_posit_8_0_model_and_reads_it_back_to_the_same_scores() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let o = qcandle(&[
        "train",
        "--model",
        "lenet5",
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
    assert!(o.status.success(), "{}", stderr(&o));
    let ptq = dir.path().join("ptq");
    let model = run.join("model.safetensors");
    // The architecture and the dataset come from the run's run.json.
    let o = qcandle(&[
        "ptq",
        "--model",
        model.to_str().unwrap(),
        "--format",
        "posit<8,0>",
        "--out",
        ptq.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    let rows = table_rows(&out);
    let names: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "float32",
            "float16",
            "int8",
            "posit<8,0> naive",
            "posit<8,0> quire"
        ],
        "{out}"
    );
    assert!(out.contains("lower class index"), "{out}");
    assert_eq!(
        std::fs::read_to_string(ptq.join("ptq.md")).unwrap(),
        out,
        "ptq.md holds the printed report"
    );
    let csv = std::fs::read_to_string(ptq.join("ptq.csv")).unwrap();
    assert!(
        csv.starts_with("method,top1,top5,tied,top1_ties_lost,top1_ties_won,seconds\nfloat32,"),
        "{csv}"
    );
    let quantized = ptq.join("model-posit_8_0.safetensors");
    let (q_len, f_len) = (
        std::fs::metadata(&quantized).unwrap().len(),
        std::fs::metadata(&model).unwrap().len(),
    );
    assert!(4 * q_len < f_len + f_len / 50, "{q_len} vs {f_len}");

    // The quantized model: format and model from its metadata; same posit scores.
    let again = dir.path().join("again");
    let o = qcandle(&[
        "ptq",
        "--model",
        quantized.to_str().unwrap(),
        "--data",
        "embedded",
        "--out",
        again.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let back = table_rows(&String::from_utf8(o.stdout).unwrap());
    for name in ["posit<8,0> naive", "posit<8,0> quire"] {
        let score = |rows: &[(String, String)]| rows.iter().find(|r| r.0 == name).cloned();
        assert_eq!(score(&rows), score(&back), "{name}");
        assert!(score(&back).is_some(), "{name}");
    }
}

#[test]
fn ptq_refuses_bad_models_and_formats_with_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("absent.safetensors");
    let lone = dir.path().join("lone.safetensors");
    let t = Tensor::zeros((6, 1, 5, 5), DType::F32, &Device::Cpu).unwrap();
    qcandle::io::write_tensors(&lone, &[("conv1.weight".to_string(), t)]).unwrap();
    let corrupt = dir.path().join("corrupt.safetensors");
    std::fs::write(&corrupt, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json").unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "ptq",
                "--model",
                missing.to_str().unwrap(),
                "--arch",
                "lenet5",
            ],
            "cannot read",
        ),
        (
            vec!["ptq", "--model", lone.to_str().unwrap()],
            "cannot tell which model",
        ),
        (
            vec!["ptq", "--model", lone.to_str().unwrap(), "--arch", "lenet5"],
            "missing tensors conv1.bias",
        ),
        (
            vec![
                "ptq",
                "--model",
                corrupt.to_str().unwrap(),
                "--arch",
                "lenet5",
            ],
            "truncated or corrupt",
        ),
        (
            vec![
                "ptq",
                "--model",
                lone.to_str().unwrap(),
                "--format",
                "posit<8,9>",
            ],
            "es",
        ),
    ];
    for (args, needle) in cases {
        let o = qcandle(&args);
        assert_refused(&o, &args, needle);
    }
}

#[test]
fn quantize_takes_an_lns_format() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("w.npy"), dir.path().join("q.npy"));
    sample().write_npy(&input).unwrap();
    let (i, o) = (input.to_str().unwrap(), output.to_str().unwrap());
    let run = qcandle(&["quantize", "--format", "lns<8,3>", i, o]);
    assert!(run.status.success(), "{}", stderr(&run));
    let got = Tensor::read_npy(&output).unwrap();
    let want = quantize(&sample(), &Quant::new("lns<8,3>".parse().unwrap())).unwrap();
    assert_eq!(
        got.to_vec2::<f32>().unwrap(),
        want.to_vec2::<f32>().unwrap()
    );
    let bad = qcandle(&["quantize", "--format", "lns<8,7>", i, o]);
    // clap refuses the argument (exit 2) with the format's own message, no panic.
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("f <= w - 2 = 6"), "{}", stderr(&bad));
    assert!(!stderr(&bad).contains("panicked"));
    let listed = String::from_utf8(qcandle(&["formats"]).stdout).unwrap();
    assert!(
        listed
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some("lns<8,3>")),
        "{listed}"
    );
}

#[test]
fn ptq_takes_a_format_with_accumulate_settings_as_its_rows_and_refuses_rows_that_cannot_apply() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("lenet5.safetensors");
    let varmap = candle_nn::VarMap::new();
    let vb = candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    qcandle::nn::ModelKind::Lenet5
        .build(vb, &qcandle::nn::QConfig::default())
        .unwrap();
    qcandle::train::init_vars(&varmap, 5).unwrap();
    let tensors: Vec<(String, Tensor)> = varmap
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
        .collect();
    qcandle::io::write_tensors(&model, &tensors).unwrap();
    let m = model.to_str().unwrap();
    let base = [
        "ptq", "--model", m, "--arch", "lenet5", "--data", "embedded",
    ];
    let out = dir.path().join("ptq");
    let mut args = base.to_vec();
    args.extend([
        "--format",
        "e4m3 naive:fp16 fma:fp32",
        "--format",
        "lns<8,3> lns:table",
        "--out",
        out.to_str().unwrap(),
    ]);
    let o = qcandle(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8(o.stdout).unwrap();
    let names: Vec<String> = table_rows(&text).into_iter().map(|r| r.0).collect();
    assert_eq!(
        names,
        [
            "float32",
            "float16",
            "int8",
            "e4m3 naive:fp16",
            "e4m3 fma:fp32",
            "lns<8,3> lns:table"
        ],
        "{text}"
    );
    let csv = std::fs::read_to_string(out.join("ptq.csv")).unwrap();
    assert!(csv.contains("\n\"lns<8,3> lns:table\","), "{csv}");
    for file in ["model-e4m3.safetensors", "model-lns_8_3.safetensors"] {
        assert!(out.join(file).exists(), "{file}");
    }
    let bad = dir.path().join("bad");
    for (spec, code, needle) in [
        ("e4m3 quire", 1, "quire needs a posit format"),
        ("lns<8,3> naive:fp16", 1, "logarithmic"),
        ("e4m3 naive:fp17x", 2, "accumulate `naive:fp17x`"),
        ("e4m3 naive naive", 2, "asked for twice"),
    ] {
        let mut args = base.to_vec();
        args.extend(["--format", spec, "--out", bad.to_str().unwrap()]);
        let o = qcandle(&args);
        assert_eq!(o.status.code(), Some(code), "{spec}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{spec}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"), "{spec}");
        assert!(
            !bad.exists(),
            "{spec}: nothing is written before the rows are checked"
        );
    }
}

/// `train`'s stdout (the metrics CSV) without its `seconds` column, wherever it stands.
fn metrics_without_seconds(dir: &Path, extra: &[&str]) -> Vec<Vec<String>> {
    let csv = train_csv(dir, extra);
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let seconds = header.iter().position(|h| *h == "seconds").unwrap();
    csv.lines()
        .map(|l| {
            let mut cells: Vec<String> = l.split(',').map(String::from).collect();
            cells.remove(seconds);
            cells
        })
        .collect()
}

#[test]
fn the_loss_scale_flag_replaces_the_configs_and_bad_values_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let scaled = dir.path().join("scaled.toml");
    let plain = dir.path().join("plain.toml");
    std::fs::write(
        &scaled,
        "error = \"e4m3\"\nloss_scale = \"dynamic:init=4096\"\n",
    )
    .unwrap();
    std::fs::write(&plain, "error = \"e4m3\"\n").unwrap();
    let (scaled, plain) = (scaled.to_str().unwrap(), plain.to_str().unwrap());
    let from_config = metrics_without_seconds(dir.path(), &["--config", scaled]);
    let from_flag = metrics_without_seconds(
        dir.path(),
        &["--config", plain, "--loss-scale", "dynamic:init=4096"],
    );
    assert_eq!(from_config, from_flag);
    assert_eq!(from_config[0][5..], ["loss_scale", "skipped_steps"]);
    let run = dir.path().join("runs/mlp-embedded-plain-s0");
    let recorded = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(
        recorded.contains("loss_scale = \"dynamic:init=4096.0,"),
        "{recorded}"
    );
    let none = metrics_without_seconds(
        dir.path(),
        &["--config", scaled, "--loss-scale", "none", "--out", "none"],
    );
    assert_eq!(none[0].len(), 5, "{none:?}");
    assert_ne!(none[1][..4], from_config[1][..4]);

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "loss_scale = -1\n").unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["train", "--loss-scale=0"], "static scale must be"),
        (vec!["train", "--loss-scale", "nan"], "static scale must be"),
        (
            vec!["train", "--loss-scale", "dynamic:growth_factor=0.5"],
            "growth_factor must be",
        ),
        (
            vec!["train", "--loss-scale", "dynamic:growth_interval=0"],
            "growth_interval must be",
        ),
        (
            vec![
                "train",
                "--data",
                "embedded",
                "--config",
                bad.to_str().unwrap(),
            ],
            "loss_scale",
        ),
    ];
    for (args, needle) in cases {
        let o = qcandle_in(Some(dir.path()), &args);
        assert_refused(&o, &args, needle);
    }
}

/// The tool's main thread joins rayon's pool where the pool has two threads or more
/// (`src/bin/qcandle/threads.rs`), and stays outside it with `RAYON_NUM_THREADS=1`. A
/// LeNet-5 run in quire posit<16,1> arithmetic, whose banded GEMMs put their helpers on the
/// main thread's own queue when it is in the pool, writes the same model, checkpoint and
/// metrics (but the time column) either way.
#[test]
fn training_with_the_main_thread_in_rayons_pool_gives_the_run_of_one_thread() {
    let dir = tempfile::tempdir().unwrap();
    let config = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/configs/quire-posit_16_1.toml"
    );
    let run = |name: &str, threads: Option<&str>| {
        let out = dir.path().join(name);
        let mut command = command(&[
            "train",
            "--model",
            "lenet5",
            "--data",
            "embedded",
            "--train-limit",
            "512",
            "--batch",
            "64",
            "--epochs",
            "1",
            "--config",
            config,
            "--quiet",
            "--out",
            out.to_str().unwrap(),
        ]);
        command.env_remove("RAYON_NUM_THREADS");
        if let Some(n) = threads {
            command.env("RAYON_NUM_THREADS", n);
        }
        let o = command.output().expect("the binary runs");
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        out
    };
    let pooled = run("pooled", None);
    let alone = run("alone", Some("1"));
    for file in ["model.safetensors", "checkpoint.safetensors"] {
        let a = std::fs::read(pooled.join(file)).unwrap();
        let b = std::fs::read(alone.join(file)).unwrap();
        assert!(a == b, "{file} differs between the thread settings");
    }
    let metrics = |dir: &Path| {
        std::fs::read_to_string(dir.join("metrics.csv"))
            .unwrap()
            .lines()
            .map(|l| l.rsplit_once(',').unwrap().0.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(metrics(&pooled), metrics(&alone));
    assert_eq!(metrics(&pooled).len(), 2, "a header and one epoch");
}
