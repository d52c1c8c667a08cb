//! Sweep specs and plans: every check names the field at fault, the grid expands in the
//! documented order, names are stable and unique, overrides reach the config.

use std::path::{Path, PathBuf};

use qcandle::nn::Category;
use qcandle::sweep::report::mean_std;
use qcandle::sweep::{Key, Plan, Spec};

/// Parses `text` as a spec living in `dir` and expands it.
fn plan_in(dir: &Path, text: &str) -> anyhow::Result<Plan> {
    let spec = Spec::parse(text, &dir.join("spec.toml"))?;
    Plan::expand(&spec)
}

fn plan(text: &str) -> anyhow::Result<Plan> {
    plan_in(Path::new("."), text)
}

/// The error of `plan(text)`, with its causes.
fn error(text: &str) -> String {
    match plan(text) {
        Ok(p) => panic!("expected an error, got {} points", p.points.len()),
        Err(e) => format!("{e:#}"),
    }
}

fn names(plan: &Plan) -> Vec<&str> {
    plan.points.iter().map(|p| p.name.as_str()).collect()
}

const SMOKE: &str = r#"
name = "t"
[base]
model = "mlp"
data = "embedded"
epochs = 1
[grid]
config = ["float32", "posit<16,1>"]
seed = [0, 1]
"#;

#[test]
fn the_grid_is_a_cartesian_product_first_axis_slowest() {
    let p = plan(SMOKE).unwrap();
    assert_eq!(
        names(&p),
        ["float32-s0", "float32-s1", "posit_16_1-s0", "posit_16_1-s1"]
    );
    assert_eq!(p.axes, [Key::Config, Key::Seed]);
    for (i, point) in p.points.iter().enumerate() {
        assert_eq!(point.index, i);
        assert_eq!(point.settings.options.seed, (i % 2) as u64);
        assert_eq!(point.settings.options.model, "mlp");
        assert_eq!(point.settings.options.epochs, 1);
    }
    let posit = &p.points[2].settings.config;
    assert_eq!(posit.base.weight.unwrap().format.to_string(), "posit<16,1>");
    assert_eq!(p.points[0].settings.config.base.weight, None);
}

#[test]
fn axes_keep_their_file_order_in_names_and_columns() {
    let p = plan(
        r#"
name = "t"
[base]
data = "embedded"
[grid]
seed = [3]
config = ["bf16"]
"#,
    )
    .unwrap();
    assert_eq!(p.axes, [Key::Seed, Key::Config]);
    assert_eq!(names(&p), ["s3-bf16"]);
}

#[test]
fn zip_axes_advance_together_after_the_grid() {
    let p = plan(
        r#"
name = "t"
[base]
data = "embedded"
[grid]
seed = [0, 1]
[zip]
lr = [0.001, 0.01]
batch = [64, 128]
"#,
    )
    .unwrap();
    let got: Vec<(u64, f64, usize)> = p
        .points
        .iter()
        .map(|p| {
            let o = &p.settings.options;
            (o.seed, o.lr, o.batch)
        })
        .collect();
    assert_eq!(
        got,
        [
            (0, 0.001, 64),
            (0, 0.01, 128),
            (1, 0.001, 64),
            (1, 0.01, 128)
        ]
    );
    assert_eq!(p.points[1].name, "s0-lr0.01-b128");
}

#[test]
fn several_grids_concatenate_and_category_format_set_one_category() {
    let p = plan(
        r#"
name = "t"
[base]
data = "embedded"
[[grid]]
category = ["weight", "error"]
format = ["posit<8,0>", "e4m3"]
[[grid]]
config = ["float32"]
"#,
    )
    .unwrap();
    assert_eq!(
        names(&p),
        [
            "weight-posit_8_0",
            "weight-e4m3",
            "error-posit_8_0",
            "error-e4m3",
            "float32"
        ]
    );
    for point in &p.points[..4] {
        let base = &point.settings.config.base;
        let category: Category = point
            .axis(Key::Category)
            .unwrap()
            .to_string()
            .parse()
            .unwrap();
        for c in Category::ALL {
            let want = (c == category).then(|| point.axis(Key::Format).unwrap().to_string());
            assert_eq!(
                base.get(c).map(|s| s.format.to_string()),
                want,
                "{} {c}",
                point.name
            );
        }
    }
    assert_eq!(p.points[4].axis(Key::Category), None);
}

#[test]
fn category_all_sets_every_category_but_the_accumulator() {
    let p = plan(
        r#"
name = "t"
[grid]
category = ["all"]
format = ["e5m2", "float32"]
"#,
    )
    .unwrap();
    let c = &p.points[0].settings.config.base;
    for cat in Category::ALL {
        let set = c.get(cat).is_some();
        assert_eq!(set, cat != Category::Accumulator, "{cat}");
    }
    // float32 as a category's value: not rounded.
    assert_eq!(p.points[1].settings.config.base.weight, None);
}

#[test]
fn a_category_override_replaces_the_config_file_in_every_layer() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("mixed.toml"),
        "seed = 7\nweight = \"bf16\"\nactivation = \"bf16\"\n[[layer]]\npattern = \"fc*\"\nweight = \"e5m2\"\n",
    )
    .unwrap();
    let p = plan_in(
        dir.path(),
        r#"
name = "t"
[base]
config = "mixed.toml"
[grid]
weight = ["posit<8,0>", { format = "posit<8,0>", rounding = "stochastic" }]
"#,
    )
    .unwrap();
    let config = &p.points[0].settings.config;
    // The file's own seed is the run's seed when the spec gives none, as for `train`.
    assert_eq!(p.points[0].settings.options.seed, 7);
    assert_eq!(config.seed, 7);
    assert_eq!(
        config.layer("fc1").weight.unwrap().format.to_string(),
        "posit<8,0>"
    );
    assert_eq!(
        config.layer("conv1").activation.unwrap().format.to_string(),
        "bf16"
    );
    assert_eq!(p.points[0].name, "weight-posit_8_0");
    assert_eq!(p.points[1].name, "weight-posit_8_0_stochastic");
    assert_ne!(
        p.points[0].settings.config.to_toml(),
        p.points[1].settings.config.to_toml()
    );
}

#[test]
fn relative_config_files_are_found_beside_the_spec_and_named_by_their_stem() {
    let dir = tempfile::tempdir().unwrap();
    for sub in ["a", "b"] {
        std::fs::create_dir(dir.path().join(sub)).unwrap();
        std::fs::write(
            dir.path().join(sub).join("mixed.toml"),
            format!(
                "weight = \"{}\"\n",
                if sub == "a" { "bf16" } else { "fp16" }
            ),
        )
        .unwrap();
    }
    let p = plan_in(
        dir.path(),
        "name = \"t\"\n[grid]\nconfig = [\"a/mixed.toml\", \"b/mixed.toml\"]\n",
    )
    .unwrap();
    // Both stems are `mixed`: the names get a hash of the settings to stay apart.
    let (a, b) = (&p.points[0].name, &p.points[1].name);
    assert!(
        a.starts_with("mixed-") && b.starts_with("mixed-") && a != b,
        "{a} {b}"
    );
    // The files exist only beside the spec (a temporary directory), not in the working
    // directory: they were found through the spec's directory.
    assert!(!Path::new("a/mixed.toml").exists());
}

#[test]
fn names_depend_on_the_axes_only_so_a_longer_base_keeps_them() {
    let longer = SMOKE.replace("epochs = 1", "epochs = 5");
    let (a, b) = (plan(SMOKE).unwrap(), plan(&longer).unwrap());
    assert_eq!(names(&a), names(&b));
    // ... while the settings, which tasks check against plan.json, differ.
    assert_ne!(a.points[0].settings.digest(), b.points[0].settings.digest());
}

#[test]
fn long_names_are_cut_and_given_a_hash() {
    let long = "x".repeat(150);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(format!("{long}.toml")),
        "weight = \"bf16\"\n",
    )
    .unwrap();
    let p = plan_in(
        dir.path(),
        &format!("name = \"t\"\n[grid]\nconfig = [\"{long}.toml\"]\nseed = [1, 2]\n"),
    )
    .unwrap();
    let names = names(&p);
    assert!(
        names
            .iter()
            .all(|n| n.len() <= qcandle::sweep::plan::MAX_NAME),
        "{names:?}"
    );
    assert_ne!(names[0], names[1]);
}

#[test]
fn exclude_drops_matching_points_and_warns_about_entries_that_match_none() {
    let p = plan(&format!(
        "{SMOKE}\n[[exclude]]\nconfig = \"float32\"\nseed = 1\n[[exclude]]\nconfig = \"bf16\"\n"
    ))
    .unwrap();
    assert_eq!(names(&p), ["float32-s0", "posit_16_1-s0", "posit_16_1-s1"]);
    assert_eq!(p.points[2].index, 2);
    assert_eq!(p.warnings, ["exclude[1] matches no point of the grid"]);
    // Values compare in their canonical spelling, and a list matches any of its values.
    let p = plan(&format!(
        "{SMOKE}\n[[exclude]]\nconfig = \"posit<16, 1>\"\nseed = [0, 1]\n"
    ))
    .unwrap();
    assert_eq!(names(&p), ["float32-s0", "float32-s1"]);
    let all = error(&format!("{SMOKE}\n[[exclude]]\nseed = [0, 1]\n"));
    assert!(all.contains("drops every point"), "{all}");
}

#[test]
fn a_spec_without_a_grid_is_one_point_named_after_the_sweep() {
    let p = plan("name = \"lone\"\n[base]\ndata = \"embedded\"\n").unwrap();
    assert_eq!(names(&p), ["lone"]);
    assert_eq!(p.points[0].settings.options.model, "lenet5");
    assert_eq!(p.points[0].settings.options.epochs, 10);
}

#[test]
fn a_ptq_format_may_name_its_rows_and_a_bare_one_keeps_its_point_identity() {
    let text = "name = \"t\"\nptq = [\"posit<8,0>\", \"e4m3 naive:fp32 fma:fp32\"]\n[base]\ndata = \"embedded\"\n";
    let p = plan(text).unwrap();
    let ptq: Vec<String> = p.points[0]
        .settings
        .ptq
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(ptq, ["posit<8,0>", "e4m3 naive:fp32 fma:fp32"]);
    let identity = p.points[0].settings.identity();
    assert!(
        identity.contains(r#""ptq":["posit<8,0>","e4m3 naive:fp32 fma:fp32"]"#),
        "{identity}"
    );
}

#[test]
fn invalid_specs_name_the_field() {
    let cases: &[(&str, &str)] = &[
        ("[base]\nmodel = \"mlp\"\n", "name: missing"),
        ("name = \"a b\"\n", "name: `a b`"),
        ("name = \"t\"\nsweep = 1\n", "`sweep`: unknown field"),
        ("name = \"t\"\n[grid]\nsede = [1]\n", "grid: unknown setting `sede`"),
        ("name = \"t\"\n[grid]\nseed = []\n", "grid.seed: an empty list"),
        ("name = \"t\"\n[grid]\nseed = 1\n", "grid.seed: an axis is a list"),
        ("name = \"t\"\n[grid]\nseed = [1, 1]\n", "grid.seed: `1` is listed twice"),
        (
            "name = \"t\"\n[grid]\ncategory = [\"weight\"]\nformat = [\"posit<8,0>\", \"posit<8,99>\"]\n",
            "grid.format[1]",
        ),
        ("name = \"t\"\n[grid]\nconfig = [\"nonsense\"]\n", "grid.config[0]"),
        ("name = \"t\"\n[grid]\ncategory = [\"weights\"]\nformat = [\"e4m3\"]\n", "unknown category `weights`"),
        ("name = \"t\"\n[grid]\nepochs = [0]\n", "grid.epochs[0]: must be at least 1"),
        ("name = \"t\"\n[grid]\nlr = [-0.1]\n", "grid.lr[0]: the learning rate must be positive"),
        ("name = \"t\"\n[grid]\nmodel = [\"resnet\"]\n", "grid.model[0]"),
        ("name = \"t\"\n[grid]\noptimizer = [\"lion\"]\n", "grid.optimizer[0]"),
        ("name = \"t\"\n[grid]\ndata = [\"cifar\"]\n", "grid.data[0]"),
        ("name = \"t\"\n[grid]\ndevice = [\"gpu\"]\n", "grid.device[0]"),
        ("name = \"t\"\n[base]\nseed = [1, 2]\n", "base.seed: a list belongs in [grid]"),
        ("name = \"t\"\nptq = [\"block<8>\"]\n", "ptq"),
        ("name = \"t\"\nptq = [\"posit<8\"]\n", "ptq[0]"),
        ("name = \"t\"\nptq = [\"e4m3 quire\"]\n", "quire needs a posit format"),
        ("name = \"t\"\nptq = [\"e4m3 sum:fp16\"]\n", "ptq[0]"),
        (
            "name = \"t\"\n[grid]\nseed = [1]\n[zip]\nlr = [0.1, 0.2]\nbatch = [1]\n",
            "`lr` has 2, `batch` has 1",
        ),
        (
            "name = \"t\"\n[grid]\nseed = [1]\nzip = { seed = [2] }\n",
            "`seed` is both a grid axis and a zip axis",
        ),
        ("name = \"t\"\n[grid]\ncategory = [\"weight\"]\n", "`category` needs a `format`"),
        ("name = \"t\"\n[grid]\nformat = [\"e4m3\"]\n", "`format` needs a `category`"),
        (
            "name = \"t\"\n[base]\ndata = \"embedded\"\ndata-dir = \"/x\"\n",
            "data is `embedded`",
        ),
        ("name = \"t\"\n[[exclude]]\nseeds = 1\n", "exclude[0]: unknown setting `seeds`"),
        ("name = \"t\"\n[[exclude]]\n", "exclude[0]: an empty entry"),
        ("name = \"t\"\n[grid]\n", "grid: no axes"),
        ("name = \"t\"\ngrid = []\n", "grid: an empty list"),
        ("name = \"t\"\n[base\n", "not valid TOML"),
    ];
    for (text, want) in cases {
        let e = error(text);
        assert!(
            e.contains(want),
            "spec:\n{text}\nerror: {e}\nwanted: {want}"
        );
    }
}

#[test]
fn two_points_with_equal_settings_are_refused() {
    let e = error(
        r#"
name = "t"
[[grid]]
config = ["posit<16,1>"]
[[grid]]
category = ["all"]
format = ["posit<16,1>"]
"#,
    );
    assert!(e.contains("are the same run"), "{e}");
}

#[test]
fn a_grid_too_large_to_expand_is_refused_before_expansion() {
    let list = |range: std::ops::RangeInclusive<u32>| {
        range.map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
    };
    let e = error(&format!(
        "name = \"t\"\n[grid]\nseed = [{}]\nepochs = [{}]\n",
        list(0..=999),
        list(1..=200)
    ));
    assert!(e.contains("more than 100000"), "{e}");
}

#[test]
fn spec_files_are_read_with_the_path_in_errors() {
    let missing = PathBuf::from("/nonexistent/spec.toml");
    let e = format!("{:#}", Spec::load(&missing).unwrap_err());
    assert!(e.contains("/nonexistent/spec.toml"), "{e}");
}

#[test]
fn mean_and_sample_standard_deviation() {
    let (m, s) = mean_std(&[88.0, 89.0, 90.5]);
    assert!((m - 89.166_666_666_666_67).abs() < 1e-12);
    let direct = ((88.0f64 - m).powi(2) + (89.0 - m).powi(2) + (90.5 - m).powi(2)) / 2.0;
    assert!((s.unwrap() - direct.sqrt()).abs() < 1e-12);
    assert_eq!(mean_std(&[5.0]), (5.0, None));
}

#[test]
fn csv_fields_read_back_what_csv_field_writes() {
    use qcandle::io::{csv_field, csv_fields};
    let fields = ["posit<8,0> quire", "plain", "say \"hi\", twice", "", "a\"b"];
    let line: Vec<String> = fields.iter().map(|f| csv_field(f)).collect();
    let line = line.join(",");
    assert_eq!(csv_fields(&line), fields);
    assert_eq!(csv_field("posit<8,0>"), "\"posit<8,0>\"");
    assert_eq!(csv_field("e4m3"), "e4m3");
}

#[test]
fn an_accumulate_axis_sets_every_layers_arithmetic() {
    let p = plan(
        r#"
name = "acc"
[base]
model = "mlp"
data = "embedded"
config = "posit<16,1>"
[grid]
accumulate = ["f32", "quire", "naive:fp16"]
"#,
    )
    .unwrap();
    assert_eq!(names(&p), ["acc-f32", "acc-quire", "acc-naive_fp16"]);
    let settings: Vec<String> = p
        .points
        .iter()
        .map(|pt| pt.settings.config.accumulate("fc1").to_string())
        .collect();
    assert_eq!(settings, ["f32", "quire", "naive:fp16"]);
    let e = error(
        r#"
name = "acc"
[grid]
accumulate = ["quire", "exact"]
"#,
    );
    assert!(
        e.contains("grid.accumulate[1]") && e.contains("expected one of"),
        "{e}"
    );
}

#[test]
fn stats_in_base_reach_every_point_and_are_not_part_of_its_identity() {
    use qcandle::run_stats::StatsEvery;
    let with = |stats: &str| plan(&SMOKE.replace("epochs = 1", &format!("epochs = 1\n{stats}")));
    let cases = [
        ("stats = \"every=7\"", Some(StatsEvery(7))),
        ("stats = 7", Some(StatsEvery(7))),
        ("stats = true", Some(StatsEvery(50))),
        ("stats = false", None),
    ];
    let without = plan(SMOKE).unwrap();
    for (line, want) in cases {
        let p = with(line).unwrap();
        assert!(
            p.points.iter().all(|pt| pt.settings.stats == want),
            "{line}"
        );
        // Same names and digests as without statistics: they change no number of a run.
        for (a, b) in p.points.iter().zip(&without.points) {
            assert_eq!(
                (&a.name, a.settings.digest()),
                (&b.name, b.settings.digest())
            );
        }
    }
    assert!(without.points.iter().all(|pt| pt.settings.stats.is_none()));
    let cases: &[(&str, &str)] = &[
        (
            "[base]\nstats = \"every=0\"\n",
            "base.stats: `every=0`: expected \"every=N\"",
        ),
        ("[base]\nstats = 0\n", "base.stats: 0: expected"),
        ("[base]\nstats = 2.5\n", "base.stats: expected \"every=N\""),
        ("[base]\nstats = \"often\"\n", "base.stats: `often`"),
        (
            "[grid]\nstats = [1, 50]\n",
            "grid.stats: `stats` is a setting of every point and belongs in [base]",
        ),
        (
            "[grid]\nseed = [1]\n[zip]\nstats = [1]\n",
            "zip.stats: `stats` is a setting",
        ),
        (
            "[grid]\nseed = [1, 2]\n[[exclude]]\nstats = 1\n",
            "exclude[0].stats: `stats` is a setting",
        ),
        (
            "[base]\nstats = 1\ndevice = \"cuda\"\n",
            "stats: rounding statistics are recorded on the CPU only",
        ),
    ];
    for (body, want) in cases {
        let text = format!("name = \"t\"\n{body}");
        let e = error(&text);
        assert!(
            e.contains(want),
            "spec:\n{text}\nerror: {e}\nwanted: {want}"
        );
    }
}
