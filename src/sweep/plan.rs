//! A spec expanded into its points: the settings of every run, its stable name and index.
//!
//! Order: the grids in file order; within a grid, the cartesian product of its axes with
//! the first axis slowest (nested loops in file order), the `zip` axes advancing together
//! as one last axis; excluded points are dropped and the rest numbered from 0. The index is
//! what a Slurm array task is given, so a plan is recorded in the sweep directory
//! (`plan.json`) and a task checks that its spec still gives the point it was planned as.
//!
//! Names: a point is named by its axis values in axis order (`weight-posit_8_0-s1`), not by
//! `[base]`, so raising `epochs` in `[base]` keeps every name (and the runs resume). A name
//! longer than [`MAX_NAME`] characters, or one that two different points would share, gets
//! a short hash of the point's settings.
//!
//! Two points with the same settings are an error: they would be one run.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{anyhow, bail, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::spec::{config_path, file_safe, Key, Spec, Value, MAX_POINTS};
use crate::data::DataSource;
use crate::nn::{Category, QConfig, QuantSpec};
use crate::optim::{Decay, LrSchedule};
use crate::run_stats::StatsEvery;
use crate::train::{OptimizerKind, TrainOptions};

/// Longest run name kept as it is; longer ones are cut and given a hash.
pub const MAX_NAME: usize = 96;

/// Everything one point's run needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The training options (`config_name` says the config and its overrides).
    pub options: TrainOptions,
    /// The quantization config with the point's overrides applied.
    pub config: QConfig,
    /// Where the data comes from.
    pub data: DataSource,
    /// The directory of the dataset's files (default: the dataset's standard place).
    pub data_dir: Option<PathBuf>,
    /// Formats (and rows) of the post-training quantization step (empty: none).
    pub ptq: Vec<crate::ptq::FormatRows>,
    /// Rounding statistics to record while training (`[base]`'s `stats`; none: none).
    pub stats: Option<StatsEvery>,
}

impl Settings {
    /// A canonical text of every setting that changes the point's results (not the config's
    /// label): equal for two points exactly when they are the same run. `stats` is not part
    /// of it: recording statistics changes no number of the run.
    pub fn identity(&self) -> String {
        let o = &self.options;
        let ptq: Vec<String> = self.ptq.iter().map(ToString::to_string).collect();
        let mut identity = serde_json::json!({
            "model": o.model,
            "epochs": o.epochs,
            "batch": o.batch,
            "lr": format!("{:?}", o.lr),
            "optimizer": o.optimizer.to_string(),
            "seed": o.seed,
            "train_limit": o.train_limit,
            "config": self.config.to_toml(),
            "data": self.data.to_string(),
            "data_dir": self.data_dir,
            "device": o.device.to_string(),
            "ptq": ptq,
        });
        // Added only when set, so that the points of specs written before these settings
        // existed keep their identity, digest and name.
        let extra = identity.as_object_mut().expect("an object");
        if !o.schedule.is_constant() {
            extra.insert("schedule".into(), serde_json::json!(o.schedule.to_string()));
        }
        if let Some(wd) = o.weight_decay {
            extra.insert("weight_decay".into(), serde_json::json!(format!("{wd:?}")));
        }
        if let Some(b) = o.beta2 {
            extra.insert("beta2".into(), serde_json::json!(format!("{b:?}")));
        }
        identity.to_string()
    }

    /// The first 16 hex digits of the SHA-256 of [`Settings::identity`].
    pub fn digest(&self) -> String {
        short_hash(&self.identity(), 16)
    }
}

/// One run of a sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// Its position in the plan (a Slurm array task's index).
    pub index: usize,
    /// Its run name: the directory `runs/<name>` of the sweep holds its run.
    pub name: String,
    /// Its value of each axis of its grid, in axis order.
    pub axes: Vec<(Key, Value)>,
    /// Its settings.
    pub settings: Settings,
}

impl Point {
    /// The point's value of `key` (an axis of its grid), if it has one.
    pub fn axis(&self, key: Key) -> Option<&Value> {
        self.axes.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }
}

/// A spec expanded.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The spec.
    pub spec: Spec,
    /// Every axis of the spec, in file order (the report's columns).
    pub axes: Vec<Key>,
    /// The points, in index order.
    pub points: Vec<Point>,
    /// Things that are probably mistakes but not errors (an `exclude` entry matching
    /// nothing).
    pub warnings: Vec<String>,
}

/// One point of `plan.json`: what a task checks its spec against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedPoint {
    /// The index.
    pub index: usize,
    /// The run name.
    pub name: String,
    /// [`Settings::digest`].
    pub digest: String,
}

/// The record of a plan, written to `DIR/plan.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanRecord {
    /// The sweep's name.
    pub sweep: String,
    /// The points.
    pub points: Vec<PlannedPoint>,
}

impl Plan {
    /// Expands `spec` (see the module docs).
    pub fn expand(spec: &Spec) -> Result<Plan> {
        let dir = spec
            .path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        let mut total: usize = 0;
        for grid in &spec.grids {
            let mut count: usize = grid.zip.first().map_or(1, |(_, v)| v.len());
            for (_, values) in &grid.axes {
                count = count.saturating_mul(values.len());
            }
            total = total.saturating_add(count);
        }
        if total > MAX_POINTS {
            bail!("the grid has {total} points, more than {MAX_POINTS}: check the axes' lists");
        }
        let combos: Vec<Vec<(Key, Value)>> = if spec.grids.is_empty() {
            vec![Vec::new()]
        } else {
            spec.grids.iter().flat_map(grid_points).collect()
        };
        let mut matched = vec![0usize; spec.exclude.len()];
        let mut points = Vec::new();
        for axes in combos {
            let merged: Vec<(Key, Value)> = spec
                .base
                .iter()
                .filter(|(k, _)| !axes.iter().any(|(a, _)| a == k))
                .chain(&axes)
                .cloned()
                .collect();
            let mut excluded = false;
            for (i, entry) in spec.exclude.iter().enumerate() {
                if matches_entry(&merged, entry) {
                    matched[i] += 1;
                    excluded = true;
                }
            }
            if excluded {
                continue;
            }
            let settings = resolve(dir, &merged, &spec.ptq)
                .map_err(|e| anyhow!("the point {}: {e}", describe(&axes)))?;
            let name = base_name(&spec.name, &axes);
            points.push(Point {
                index: points.len(),
                name,
                axes,
                settings,
            });
        }
        if points.is_empty() {
            bail!("no points: `exclude` drops every point of the grid");
        }
        check_duplicates(&points)?;
        disambiguate_names(&mut points);
        let warnings = matched
            .iter()
            .enumerate()
            .filter(|(_, &n)| n == 0)
            .map(|(i, _)| format!("exclude[{i}] matches no point of the grid"))
            .collect();
        Ok(Plan {
            spec: spec.clone(),
            axes: spec.axes(),
            points,
            warnings,
        })
    }

    /// The record written to `plan.json`.
    pub fn record(&self) -> PlanRecord {
        PlanRecord {
            sweep: self.spec.name.clone(),
            points: self
                .points
                .iter()
                .map(|p| PlannedPoint {
                    index: p.index,
                    name: p.name.clone(),
                    digest: p.settings.digest(),
                })
                .collect(),
        }
    }

    /// The point named `name`.
    pub fn point_named(&self, name: &str) -> Option<&Point> {
        self.points.iter().find(|p| p.name == name)
    }
}

/// Every combination of one grid's axes (first axis slowest), then its zip axes together.
fn grid_points(grid: &super::spec::Grid) -> Vec<Vec<(Key, Value)>> {
    let mut combos: Vec<Vec<(Key, Value)>> = vec![Vec::new()];
    for (key, values) in &grid.axes {
        combos = combos
            .into_iter()
            .flat_map(|prefix| {
                values.iter().map(move |v| {
                    let mut c = prefix.clone();
                    c.push((*key, v.clone()));
                    c
                })
            })
            .collect();
    }
    if let Some((_, first)) = grid.zip.first() {
        combos = combos
            .into_iter()
            .flat_map(|prefix| {
                (0..first.len()).map(move |i| {
                    let mut c = prefix.clone();
                    c.extend(grid.zip.iter().map(|(k, vs)| (*k, vs[i].clone())));
                    c
                })
            })
            .collect();
    }
    combos
}

/// Whether the settings `merged` match every key of an `exclude` entry.
fn matches_entry(merged: &[(Key, Value)], entry: &[(Key, Vec<Value>)]) -> bool {
    entry.iter().all(|(key, values)| {
        merged
            .iter()
            .any(|(k, v)| k == key && values.iter().any(|w| w.to_string() == v.to_string()))
    })
}

/// `key=value, ...` for messages.
fn describe(axes: &[(Key, Value)]) -> String {
    if axes.is_empty() {
        return "of [base]".to_string();
    }
    let parts: Vec<String> = axes.iter().map(|(k, v)| format!("{k}={v}")).collect();
    parts.join(", ")
}

/// The readable name of a point: its axis labels joined by `-` (the sweep's name for a
/// spec without axes).
fn base_name(sweep: &str, axes: &[(Key, Value)]) -> String {
    let labels: Vec<String> = axes
        .iter()
        .map(|(k, v)| v.label(*k))
        .filter(|l| !l.is_empty())
        .collect();
    if labels.is_empty() {
        file_safe(sweep)
    } else {
        labels.join("-")
    }
}

/// The first `len` hex digits of the SHA-256 of `text`.
fn short_hash(text: &str, len: usize) -> String {
    let hex = crate::run_dir::hex(&Sha256::digest(text.as_bytes()));
    hex[..len].to_string()
}

fn check_duplicates(points: &[Point]) -> Result<()> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    for p in points {
        if let Some(&first) = seen.get(&p.settings.identity()) {
            bail!(
                "the points {first} ({}) and {} ({}) are the same run: every setting is equal",
                describe(&points[first].axes),
                p.index,
                describe(&p.axes)
            );
        }
        seen.insert(p.settings.identity(), p.index);
    }
    Ok(())
}

/// Gives a hash suffix to names that are too long or that several points share.
fn disambiguate_names(points: &mut [Point]) {
    let mut count: HashMap<String, usize> = HashMap::new();
    for p in points.iter() {
        *count.entry(p.name.clone()).or_default() += 1;
    }
    for p in points.iter_mut() {
        let shared = count[&p.name] > 1;
        if shared || p.name.len() > MAX_NAME {
            let mut stem: String = p.name.chars().take(MAX_NAME - 9).collect();
            stem = stem.trim_end_matches(['-', '_']).to_string();
            p.name = format!("{stem}-{}", short_hash(&p.settings.identity(), 8));
        }
    }
}

/// The settings of a point whose keys are `merged` (base values, then its axis values);
/// `dir` is the spec's directory.
fn resolve(
    dir: &std::path::Path,
    merged: &[(Key, Value)],
    ptq: &[crate::ptq::FormatRows],
) -> Result<Settings> {
    let get = |key: Key| merged.iter().find(|(k, _)| *k == key).map(|(_, v)| v);
    let text = |key: Key, default: &str| match get(key) {
        Some(Value::Text(s)) => s.clone(),
        _ => default.to_string(),
    };
    let count = |key: Key| match get(key) {
        Some(Value::Count(n)) => Some(*n),
        _ => None,
    };
    let real = |key: Key| match get(key) {
        Some(Value::Real(x)) => Some(*x),
        _ => None,
    };
    let usize_of =
        |key: Key, n: u64| usize::try_from(n).map_err(|_| anyhow!("{key}: {n} is too large"));
    let config_name = text(Key::Config, "float32");
    let mut config = QConfig::load(&config_path(dir, &config_name))?;
    let mut overrides = Vec::new();
    for c in Category::ALL {
        if let Some(Value::Quant(spec)) = get(Key::Quant(c)) {
            set_category(&mut config, c, *spec);
            overrides.push(format!("{}={}", c.key(), Value::Quant(*spec)));
        }
    }
    match (get(Key::Category), get(Key::Format)) {
        (Some(Value::Categories(choice)), Some(Value::Quant(spec))) => {
            for c in choice.categories() {
                set_category(&mut config, c, *spec);
            }
            overrides.push(format!(
                "{}={}",
                Value::Categories(*choice),
                Value::Quant(*spec)
            ));
        }
        (None, None) => {}
        (Some(_), _) => bail!("`category` needs a `format` to set it to"),
        (_, Some(_)) => bail!("`format` needs a `category` (or `all`) to set"),
    }
    if let Some(Value::Accumulate(a)) = get(Key::Accumulate) {
        config.accumulate = *a;
        for layer in &mut config.layers {
            layer.accumulate = None;
        }
        overrides.push(format!("accumulate={a}"));
    }
    let data: DataSource = text(Key::Data, "fashion-mnist").parse()?;
    let data_dir = match get(Key::DataDir) {
        Some(Value::Path(_, resolved)) => Some(resolved.clone()),
        _ => None,
    };
    if data == DataSource::Embedded && data_dir.is_some() {
        bail!("data-dir is given but data is `embedded`, which reads no directory");
    }
    let mut options = TrainOptions {
        model: text(Key::Model, "lenet5"),
        config_name: std::iter::once(config_name)
            .chain(overrides)
            .collect::<Vec<_>>()
            .join(" "),
        epochs: usize_of(Key::Epochs, count(Key::Epochs).unwrap_or(10))?,
        batch: usize_of(Key::Batch, count(Key::Batch).unwrap_or(128))?,
        lr: match get(Key::Lr) {
            Some(Value::Real(x)) => *x,
            _ => 1e-3,
        },
        optimizer: text(Key::Optimizer, "adam").parse::<OptimizerKind>()?,
        // As `qcandle train`: the sweep's seed when given, else the config's own.
        seed: count(Key::Seed).unwrap_or(config.seed),
        train_limit: count(Key::TrainLimit)
            .map(|n| usize_of(Key::TrainLimit, n))
            .transpose()?,
        device: text(Key::Device, "cpu").parse()?,
        schedule: LrSchedule::default(),
        weight_decay: real(Key::WeightDecay),
        beta2: real(Key::Beta2),
    };
    options.schedule = LrSchedule {
        warmup: usize_of(Key::Warmup, count(Key::Warmup).unwrap_or(0))?,
        decay: match text(Key::Decay, "none").as_str() {
            "none" => {
                if get(Key::DecayEpochs).is_some() {
                    bail!(
                        "decay-epochs is given but decay is `none`; set decay to cosine or linear"
                    );
                }
                None
            }
            shape => Some(Decay {
                shape: shape.parse().map_err(|e: String| anyhow!("decay: {e}"))?,
                epochs: match count(Key::DecayEpochs) {
                    Some(n) => usize_of(Key::DecayEpochs, n)?,
                    None => options.epochs,
                },
            }),
        },
    };
    options.validate()?;
    let stats = match get(Key::Stats) {
        Some(Value::Stats(every)) => *every,
        _ => None,
    };
    if stats.is_some() && options.device != crate::device::DeviceSpec::Cpu {
        bail!(
            "stats: rounding statistics are recorded on the CPU only, and the device is {}",
            options.device
        );
    }
    Ok(Settings {
        config: config.with_seed(options.seed),
        options,
        data,
        data_dir,
        ptq: ptq.to_vec(),
        stats,
    })
}

/// Sets `category` to `spec` in every layer: the base setting, with the category removed
/// from every `[[layer]]` override.
fn set_category(config: &mut QConfig, category: Category, spec: Option<QuantSpec>) {
    config.base.set(category, spec);
    for layer in &mut config.layers {
        layer.set.remove(&category);
    }
}
