//! The sweep spec file: its keys, its values, and the checks that name the field at fault.
//!
//! A spec is TOML. Top-level keys: `name`, `ptq`, `exclude`, and the tables `base`, `grid`
//! and `zip`:
//!
//! ```toml
//! name = "smoke"                      # letters, digits, `.`, `_`, `-`
//! ptq = ["posit<8,0>"]                # optional: post-training quantization of each model
//!                                     # (a format, or a format and its rows: "e4m3 naive:fp32")
//!
//! [base]                              # any setting, for every point
//! model = "lenet5"
//! data = "embedded"
//! epochs = 1
//!
//! [grid]                              # axes combined as a cartesian product
//! config = ["float32", "posit<16,1>"]
//! seed = [0, 1]
//!
//! [zip]                               # axes that advance together (equal lengths)
//! lr = [1e-3, 1e-2]
//! batch = [64, 128]
//!
//! [[exclude]]                         # drop the points that match every key of an entry
//! config = "float32"
//! seed = 1
//! ```
//!
//! Several grids: `[[grid]]` tables, each expanded on its own (a table may hold its own
//! `zip = { ... }`), their points concatenated in file order. A top-level `[zip]` belongs to
//! a single `[grid]` table.
//!
//! Settings ([`Key`]): the options of `qcandle train` (`model`, `data`, `data-dir`,
//! `epochs`, `batch`, `lr`, `optimizer`, `config`, `seed`, `device`, `train-limit`, and the
//! learning-rate schedule and optimizer settings `warmup`, `decay`, `decay-epochs`,
//! `weight-decay`, `beta2`; see [`crate::optim::schedule`]); a number
//! category (`weight`, `activation`, `gradient`, `error`, `momentum`, `accumulator`) whose
//! format replaces the config's for that category in every layer (`"float32"` or `"none"`:
//! not rounded; a table `{ format = "...", rounding = "stochastic" }` sets the rounding);
//! and the pair `category` + `format`, which sets the named category (or `all`: every
//! category but the accumulator) to the format, so that one grid can set each category
//! alone; and `accumulate`, the GEMM arithmetic of every layer (`"quire"`, `"naive:fp16"`, ...;
//! see [`crate::quire::accumulate`]), replacing the config's in every layer.
//!
//! `stats` (`[base]` only) records rounding statistics in every point's run, as `qcandle
//! train --stats` does: `stats = "every=50"` (or `stats = 50`) samples every 50th step of an
//! epoch and its last step, `stats = true` is `every=50`, `stats = false` records none. It is
//! refused as a grid axis or in `exclude`: it changes no number of a run, so it is not part
//! of a point's identity (see [`super::point`] for how it decides when a point is finished).
//!
//! Relative paths (`config` files, `data-dir`) are relative to the spec file's directory, so a
//! spec means the same from any working directory.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use toml::Value as Toml;

use crate::data::DataSource;
use crate::device::DeviceSpec;
use crate::format::Format;
use crate::nn::config::parse_quant_spec;
use crate::nn::{Category, ModelKind, QConfig, QuantSpec};
use crate::optim::DecayShape;
use crate::run_stats::StatsEvery;
use crate::train::OptimizerKind;

/// A setting a spec can give, in `[base]`, as a grid axis, or in an `exclude` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// The model of the zoo.
    Model,
    /// The data source: `fashion-mnist`, `mnist` or `embedded`.
    Data,
    /// The directory of the dataset's IDX files.
    DataDir,
    /// Number of epochs.
    Epochs,
    /// Mini-batch size.
    Batch,
    /// Learning rate.
    Lr,
    /// The optimizer.
    Optimizer,
    /// The quantization config: a preset, a format, or a file.
    Config,
    /// The run's seed.
    Seed,
    /// The device: `cpu`, `cuda`, `cuda:N`.
    Device,
    /// Train on only the first N training images.
    TrainLimit,
    /// Steps of learning-rate warmup.
    Warmup,
    /// The learning-rate decay after the warmup: `cosine`, `linear` or `none`.
    Decay,
    /// The epoch at whose end the decay reaches 0 (default: `epochs`).
    DecayEpochs,
    /// The optimizer's weight decay (default: the optimizer's).
    WeightDecay,
    /// Adam's and AdamW's `β₂` (default 0.999).
    Beta2,
    /// One number category's format, replacing the config's in every layer.
    Quant(Category),
    /// The category (or `all`) that `format` sets.
    Category,
    /// The format that `category` is set to.
    Format,
    /// The `accumulate` setting of every layer.
    Accumulate,
    /// Rounding statistics of every point (`train --stats`); `[base]` only.
    Stats,
}

impl Key {
    /// Every key, in the order messages list them.
    pub fn all() -> Vec<Key> {
        let mut keys = vec![
            Key::Model,
            Key::Data,
            Key::DataDir,
            Key::Epochs,
            Key::Batch,
            Key::Lr,
            Key::Optimizer,
            Key::Config,
            Key::Seed,
            Key::Device,
            Key::TrainLimit,
            Key::Warmup,
            Key::Decay,
            Key::DecayEpochs,
            Key::WeightDecay,
            Key::Beta2,
        ];
        keys.extend(Category::ALL.map(Key::Quant));
        keys.extend([Key::Category, Key::Format, Key::Accumulate, Key::Stats]);
        keys
    }

    /// The key as the spec spells it (the command line's option name).
    pub fn name(self) -> &'static str {
        match self {
            Key::Model => "model",
            Key::Data => "data",
            Key::DataDir => "data-dir",
            Key::Epochs => "epochs",
            Key::Batch => "batch",
            Key::Lr => "lr",
            Key::Optimizer => "optimizer",
            Key::Config => "config",
            Key::Seed => "seed",
            Key::Device => "device",
            Key::TrainLimit => "train-limit",
            Key::Warmup => "warmup",
            Key::Decay => "decay",
            Key::DecayEpochs => "decay-epochs",
            Key::WeightDecay => "weight-decay",
            Key::Beta2 => "beta2",
            Key::Quant(c) => c.key(),
            Key::Category => "category",
            Key::Format => "format",
            Key::Accumulate => "accumulate",
            Key::Stats => "stats",
        }
    }

    /// The key spelled `name` (`train_limit` and `data_dir` are accepted for the dashed
    /// spellings).
    pub fn parse(name: &str, field: &str) -> Result<Key> {
        let dashed = name.replace('_', "-");
        Key::all()
            .into_iter()
            .find(|k| k.name() == dashed)
            .ok_or_else(|| {
                let names: Vec<&str> = Key::all().into_iter().map(Key::name).collect();
                anyhow!(
                    "{field}: unknown setting `{name}`; settings: {}",
                    names.join(", ")
                )
            })
    }

    /// Whether the key's values are number formats or configs (the axes a heatmap or a
    /// bit-width plot can use).
    pub fn is_format_like(self) -> bool {
        matches!(
            self,
            Key::Config | Key::Quant(_) | Key::Category | Key::Format
        )
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A checked value of a [`Key`].
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A name: model, data source, optimizer, device, config (as written), decay.
    Text(String),
    /// A path (`data-dir`), as written, and resolved against the spec's directory.
    Path(String, PathBuf),
    /// A count: epochs, batch, seed, train-limit, warmup, decay-epochs.
    Count(u64),
    /// A real number: the learning rate, the weight decay, `β₂`.
    Real(f64),
    /// A category's setting (`None`: not rounded).
    Quant(Option<QuantSpec>),
    /// The categories `category` names: one, or every one but the accumulator (`all`).
    Categories(CategoryChoice),
    /// An `accumulate` setting.
    Accumulate(crate::quire::Accumulate),
    /// The `stats` setting: the sampling interval, or `None` for no statistics.
    Stats(Option<StatsEvery>),
}

/// What the `category` key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CategoryChoice {
    /// One category.
    One(Category),
    /// Every category but the accumulator.
    All,
}

impl CategoryChoice {
    /// The categories chosen.
    pub fn categories(self) -> Vec<Category> {
        match self {
            CategoryChoice::One(c) => vec![c],
            CategoryChoice::All => Category::ALL
                .into_iter()
                .filter(|&c| c != Category::Accumulator)
                .collect(),
        }
    }
}

impl fmt::Display for Value {
    /// The canonical spelling: what report columns show and `exclude` entries compare.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Text(s) | Value::Path(s, _) => f.write_str(s),
            Value::Count(n) => write!(f, "{n}"),
            Value::Real(x) => write!(f, "{x:?}"),
            Value::Quant(None) => f.write_str("float32"),
            Value::Quant(Some(q)) => match q.rounding {
                crate::Rounding::NearestEven => write!(f, "{}", q.format),
                r => write!(f, "{} {r}", q.format),
            },
            Value::Categories(CategoryChoice::One(c)) => f.write_str(c.key()),
            Value::Categories(CategoryChoice::All) => f.write_str("all"),
            Value::Accumulate(a) => write!(f, "{a}"),
            Value::Stats(Some(every)) => write!(f, "every={}", every.0),
            Value::Stats(None) => f.write_str("off"),
        }
    }
}

impl Value {
    /// The value as a piece of a run name: short, readable, and safe in a file name
    /// (`posit<8,0>` gives `posit_8_0`, seed 3 gives `s3`, a config file its stem).
    pub fn label(&self, key: Key) -> String {
        let text = match (key, self) {
            (Key::Config, Value::Text(s)) => crate::train::config_label(s),
            (Key::DataDir, Value::Path(s, _)) => Path::new(s)
                .file_name()
                .map_or(s.clone(), |n| n.to_string_lossy().into_owned()),
            (Key::Epochs, v) => format!("e{v}"),
            (Key::Batch, v) => format!("b{v}"),
            (Key::Lr, v) => format!("lr{v}"),
            (Key::Seed, v) => format!("s{v}"),
            (Key::TrainLimit, v) => format!("n{v}"),
            (Key::Warmup, v) => format!("warmup{v}"),
            (Key::DecayEpochs, v) => format!("decay-e{v}"),
            (Key::WeightDecay, v) => format!("wd{v}"),
            (Key::Beta2, v) => format!("beta2-{v}"),
            (Key::Quant(c), v) => format!("{}-{v}", c.key()),
            (Key::Accumulate, v) => format!("acc-{v}"),
            (_, v) => v.to_string(),
        };
        file_safe(&text)
    }
}

/// `text` with every character outside `[A-Za-z0-9._-]` replaced by `_`, runs of `_`
/// collapsed, and `_`/`-` trimmed from the ends (`posit<8,0>` gives `posit_8_0`).
pub fn file_safe(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        let c = if ch.is_ascii_alphanumeric() || matches!(ch, '.' | '-') {
            ch
        } else {
            '_'
        };
        if !(c == '_' && out.ends_with('_')) {
            out.push(c);
        }
    }
    out.trim_matches(['_', '-']).to_string()
}

/// One `[grid]` table: axes combined as a cartesian product (first axis slowest), then the
/// `zip` axes advancing together as one more axis (fastest).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Grid {
    /// Axes in file order, each with its values.
    pub axes: Axes,
    /// Axes that advance together; all lists have the same length.
    pub zip: Axes,
}

/// Settings with a list of values each: an axis list, or an `exclude` entry (a point matches
/// when its value of every key is one of the key's values).
pub type Axes = Vec<(Key, Vec<Value>)>;

/// A parsed and checked sweep spec.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// The sweep's name (its default directory is `sweeps/<name>`).
    pub name: String,
    /// The spec file.
    pub path: PathBuf,
    /// Settings of every point.
    pub base: Vec<(Key, Value)>,
    /// The grids, expanded one after the other.
    pub grids: Vec<Grid>,
    /// Entries that drop the points matching every one of their keys (a key may list
    /// several values: any of them matches).
    pub exclude: Vec<Axes>,
    /// Formats (and rows, [`crate::ptq::FormatRows`]) each trained model is post-training
    /// quantized to (none: no PTQ step).
    pub ptq: Vec<crate::ptq::FormatRows>,
}

/// At most this many points (a typo such as a 10,000-value axis is refused, not expanded).
pub const MAX_POINTS: usize = 100_000;

impl Spec {
    /// Reads and checks the spec file at `path`.
    pub fn load(path: &Path) -> Result<Spec> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the sweep spec {}", path.display()))?;
        Spec::parse(&text, path).with_context(|| format!("sweep spec {}", path.display()))
    }

    /// Parses and checks a spec whose file is `path` (relative paths inside it are
    /// resolved against `path`'s directory).
    pub fn parse(text: &str, path: &Path) -> Result<Spec> {
        let table: toml::Table = toml::from_str(text).context("not valid TOML")?;
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let reader = Reader { dir };
        let mut spec = Spec {
            name: String::new(),
            path: path.to_path_buf(),
            base: Vec::new(),
            grids: Vec::new(),
            exclude: Vec::new(),
            ptq: Vec::new(),
        };
        let mut top_zip = None;
        for (key, value) in &table {
            match key.as_str() {
                "name" => spec.name = reader.name(value)?,
                "ptq" => spec.ptq = reader.ptq(value)?,
                "base" => spec.base = reader.settings(value, "base")?,
                "grid" => spec.grids = reader.grids(value)?,
                "zip" => top_zip = Some(reader.axes(value, "zip")?),
                "exclude" => spec.exclude = reader.exclude(value)?,
                other => {
                    bail!("`{other}`: unknown field; fields: name, ptq, base, grid, zip, exclude")
                }
            }
        }
        if spec.name.is_empty() {
            bail!("name: missing (the sweep's name, e.g. name = \"formats\")");
        }
        if let Some(zip) = top_zip {
            match spec.grids.as_mut_slice() {
                [] => spec.grids.push(Grid {
                    axes: Vec::new(),
                    zip,
                }),
                [grid] if grid.zip.is_empty() => grid.zip = zip,
                [_] => bail!("zip: the grid has its own zip table; give one of them"),
                _ => bail!(
                    "zip: a top-level [zip] belongs to a single [grid]; with several [[grid]] \
                     tables put `zip = {{ ... }}` inside each"
                ),
            }
        }
        for (i, grid) in spec.grids.iter().enumerate() {
            check_zip_lengths(&grid.zip, &grid_field(i, spec.grids.len(), "zip"))?;
        }
        Ok(spec)
    }

    /// Every axis of every grid, each once, in file order.
    pub fn axes(&self) -> Vec<Key> {
        let mut keys: Vec<Key> = Vec::new();
        for grid in &self.grids {
            for (key, _) in grid.axes.iter().chain(&grid.zip) {
                if !keys.contains(key) {
                    keys.push(*key);
                }
            }
        }
        keys
    }

    /// Sets the device of every point that does not vary it (`qcandle sweep --device`):
    /// replaces `[base]`'s `device`; a `device` axis still wins.
    pub fn set_device(&mut self, device: DeviceSpec) {
        self.base.retain(|(k, _)| *k != Key::Device);
        self.base
            .push((Key::Device, Value::Text(device.to_string())));
    }

    /// The value `[base]` gives `key`, if any.
    pub fn base_value(&self, key: Key) -> Option<&Value> {
        self.base.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }
}

fn grid_field(i: usize, count: usize, sub: &str) -> String {
    match (count, sub) {
        (1, "") => "grid".to_string(),
        (1, sub) => format!("grid.{sub}"),
        (_, "") => format!("grid[{i}]"),
        (_, sub) => format!("grid[{i}].{sub}"),
    }
}

fn check_zip_lengths(zip: &[(Key, Vec<Value>)], field: &str) -> Result<()> {
    if let Some((first, values)) = zip.first() {
        for (key, other) in &zip[1..] {
            if other.len() != values.len() {
                bail!(
                    "{field}: zip axes advance together and need lists of one length: \
                     `{first}` has {}, `{key}` has {}",
                    values.len(),
                    other.len()
                );
            }
        }
    }
    Ok(())
}

/// Reads the values of a spec, resolving paths against the spec's directory.
struct Reader<'a> {
    dir: &'a Path,
}

impl Reader<'_> {
    fn name(&self, value: &Toml) -> Result<String> {
        let name = value
            .as_str()
            .ok_or_else(|| anyhow!("name: expected a string"))?;
        if name.is_empty() || file_safe(name) != name {
            bail!(
                "name: `{name}` must be non-empty and use only letters, digits, `.`, `_` and \
                 `-` (it names the sweep's directory)"
            );
        }
        Ok(name.to_string())
    }

    fn ptq(&self, value: &Toml) -> Result<Vec<crate::ptq::FormatRows>> {
        let list = value
            .as_array()
            .ok_or_else(|| anyhow!("ptq: expected a list of formats, e.g. [\"posit<8,0>\"]"))?;
        let formats = list
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let s = v
                    .as_str()
                    .ok_or_else(|| anyhow!("ptq[{i}]: expected a format string"))?;
                s.parse::<crate::ptq::FormatRows>()
                    .map_err(|e| anyhow!("ptq[{i}]: `{s}`: {e:#}"))
            })
            .collect::<Result<Vec<_>>>()?;
        crate::ptq::check_formats(&formats).context("ptq")?;
        Ok(formats)
    }

    fn settings(&self, value: &Toml, field: &str) -> Result<Vec<(Key, Value)>> {
        let table = value
            .as_table()
            .ok_or_else(|| anyhow!("{field}: expected a table of settings"))?;
        table
            .iter()
            .map(|(name, v)| {
                let key = Key::parse(name, field)?;
                let sub = format!("{field}.{name}");
                if v.is_array() {
                    bail!("{sub}: a list belongs in [grid]; [base] gives one value");
                }
                Ok((key, self.value(key, v, &sub)?))
            })
            .collect()
    }

    fn grids(&self, value: &Toml) -> Result<Vec<Grid>> {
        match value {
            Toml::Table(_) => Ok(vec![self.grid(value, "grid")?]),
            Toml::Array(list) => {
                if list.is_empty() {
                    bail!("grid: an empty list of grids");
                }
                list.iter()
                    .enumerate()
                    .map(|(i, g)| self.grid(g, &grid_field(i, list.len(), "")))
                    .collect()
            }
            _ => bail!("grid: expected a table of axes ([grid]) or tables ([[grid]])"),
        }
    }

    fn grid(&self, value: &Toml, field: &str) -> Result<Grid> {
        let table = value
            .as_table()
            .ok_or_else(|| anyhow!("{field}: expected a table of axes"))?;
        let mut grid = Grid::default();
        for (name, v) in table {
            if name == "zip" {
                grid.zip = self.axes(v, &format!("{field}.zip"))?;
            } else {
                grid.axes.push(self.axis(name, v, field)?);
            }
        }
        let zip_keys: Vec<Key> = grid.zip.iter().map(|(k, _)| *k).collect();
        if let Some((key, _)) = grid.axes.iter().find(|(k, _)| zip_keys.contains(k)) {
            bail!("{field}: `{key}` is both a grid axis and a zip axis");
        }
        if grid.axes.is_empty() && grid.zip.is_empty() {
            bail!("{field}: no axes");
        }
        Ok(grid)
    }

    fn axes(&self, value: &Toml, field: &str) -> Result<Axes> {
        let table = value
            .as_table()
            .ok_or_else(|| anyhow!("{field}: expected a table of axes"))?;
        table
            .iter()
            .map(|(name, v)| self.axis(name, v, field))
            .collect()
    }

    fn axis(&self, name: &str, value: &Toml, field: &str) -> Result<(Key, Vec<Value>)> {
        let key = Key::parse(name, field)?;
        let sub = format!("{field}.{name}");
        refuse_stats_outside_base(key, &sub)?;
        let list = value.as_array().ok_or_else(|| {
            anyhow!("{sub}: an axis is a list of values, e.g. {name} = [..., ...]")
        })?;
        if list.is_empty() {
            bail!("{sub}: an empty list (an axis needs at least one value)");
        }
        let values = list
            .iter()
            .enumerate()
            .map(|(i, v)| self.value(key, v, &format!("{sub}[{i}]")))
            .collect::<Result<Vec<_>>>()?;
        for (i, v) in values.iter().enumerate() {
            if let Some(j) = values[..i]
                .iter()
                .position(|w| w.to_string() == v.to_string())
            {
                bail!("{sub}: `{v}` is listed twice (values {j} and {i})");
            }
        }
        Ok((key, values))
    }

    fn exclude(&self, value: &Toml) -> Result<Vec<Axes>> {
        let list = value
            .as_array()
            .ok_or_else(|| anyhow!("exclude: expected a list of tables ([[exclude]])"))?;
        list.iter()
            .enumerate()
            .map(|(i, entry)| {
                let field = format!("exclude[{i}]");
                let table = entry
                    .as_table()
                    .ok_or_else(|| anyhow!("{field}: expected a table of settings"))?;
                if table.is_empty() {
                    bail!("{field}: an empty entry would exclude every point");
                }
                table
                    .iter()
                    .map(|(name, v)| {
                        let key = Key::parse(name, &field)?;
                        let sub = format!("{field}.{name}");
                        refuse_stats_outside_base(key, &sub)?;
                        let values = match v {
                            Toml::Array(list) => list
                                .iter()
                                .enumerate()
                                .map(|(j, v)| self.value(key, v, &format!("{sub}[{j}]")))
                                .collect::<Result<Vec<_>>>()?,
                            v => vec![self.value(key, v, &sub)?],
                        };
                        Ok((key, values))
                    })
                    .collect()
            })
            .collect()
    }

    /// One value of `key`, checked; errors name `field`.
    fn value(&self, key: Key, v: &Toml, field: &str) -> Result<Value> {
        let text = || {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| anyhow!("{field}: expected a string, got {v}"))
        };
        let count = |min: u64| -> Result<u64> {
            let n = v
                .as_integer()
                .ok_or_else(|| anyhow!("{field}: expected an integer, got {v}"))?;
            u64::try_from(n)
                .ok()
                .filter(|&n| n >= min)
                .ok_or_else(|| anyhow!("{field}: must be at least {min}, got {n}"))
        };
        Ok(match key {
            Key::Model => {
                let s = text()?;
                let model: ModelKind = s.parse().map_err(|e| anyhow!("{field}: {e}"))?;
                Value::Text(model.to_string())
            }
            Key::Data => {
                let s = text()?;
                let source: DataSource = s.parse().map_err(|e| anyhow!("{field}: {e}"))?;
                Value::Text(source.to_string())
            }
            Key::Optimizer => {
                let s = text()?;
                let o: OptimizerKind = s.parse().map_err(|e| anyhow!("{field}: {e}"))?;
                Value::Text(o.to_string())
            }
            Key::Device => {
                let s = text()?;
                let device: DeviceSpec = s.parse().map_err(|e| anyhow!("{field}: {e}"))?;
                Value::Text(device.to_string())
            }
            Key::DataDir => {
                let s = text()?;
                Value::Path(s.clone(), self.dir.join(&s))
            }
            Key::Config => {
                let s = text()?;
                QConfig::load(&config_path(self.dir, &s)).map_err(|e| anyhow!("{field}: {e}"))?;
                // A format in its canonical spelling (`posit<16, 1>` is `posit<16,1>`).
                let is_preset = crate::nn::config::presets().iter().any(|(n, _)| *n == s);
                match s.parse::<Format>() {
                    Ok(format) if !is_preset => Value::Text(format.to_string()),
                    _ => Value::Text(s),
                }
            }
            Key::Epochs | Key::Batch | Key::TrainLimit | Key::DecayEpochs => {
                Value::Count(count(1)?)
            }
            Key::Seed | Key::Warmup => Value::Count(count(0)?),
            Key::Decay => {
                let s = text()?;
                if s != "none" {
                    s.parse::<DecayShape>()
                        .map_err(|e| anyhow!("{field}: {e}, none"))?;
                }
                Value::Text(s)
            }
            Key::Lr | Key::WeightDecay | Key::Beta2 => {
                let x = v
                    .as_float()
                    .or_else(|| v.as_integer().map(|n| n as f64))
                    .ok_or_else(|| anyhow!("{field}: expected a number, got {v}"))?;
                match key {
                    Key::Lr if !(x.is_finite() && x > 0.0) => {
                        bail!("{field}: the learning rate must be positive and finite, got {x}")
                    }
                    Key::WeightDecay if !(x.is_finite() && x >= 0.0) => {
                        bail!("{field}: the weight decay must be finite and >= 0, got {x}")
                    }
                    Key::Beta2 if !(0.0..1.0).contains(&x) => {
                        bail!("{field}: beta2 must lie in [0, 1), got {x}")
                    }
                    _ => {}
                }
                Value::Real(x)
            }
            Key::Quant(_) | Key::Format => Value::Quant(quant_value(v, field)?),
            Key::Accumulate => {
                let s = text()?;
                Value::Accumulate(s.parse().map_err(|e| anyhow!("{field}: {e}"))?)
            }
            Key::Stats => Value::Stats(stats_value(v, field)?),
            Key::Category => {
                let s = text()?;
                Value::Categories(match s.as_str() {
                    "all" => CategoryChoice::All,
                    _ => CategoryChoice::One(s.parse().map_err(|_| {
                        let keys: Vec<&str> = Category::ALL.iter().map(|c| c.key()).collect();
                        anyhow!(
                            "{field}: unknown category `{s}`; categories: {}, all",
                            keys.join(", ")
                        )
                    })?),
                })
            }
        })
    }
}

/// `stats` anywhere but `[base]` is refused: recording statistics changes no number of a
/// run, so two points that differ only in it would be the same run.
fn refuse_stats_outside_base(key: Key, field: &str) -> Result<()> {
    if key == Key::Stats {
        bail!(
            "{field}: `stats` is a setting of every point and belongs in [base] (e.g. stats = \
             \"every=50\"); recording statistics changes no number of a run, so it is not an \
             axis and excludes nothing"
        );
    }
    Ok(())
}

/// The `stats` value: `"every=N"` or a whole number N >= 1 of steps, `true` (every 50 steps,
/// as `train --stats` alone), or `false` (none).
fn stats_value(v: &Toml, field: &str) -> Result<Option<StatsEvery>> {
    let expected = "expected \"every=N\" or a number N >= 1 of steps, or true (every=50) or \
                    false (no statistics)";
    match v {
        Toml::Boolean(true) => Ok(Some(StatsEvery::default())),
        Toml::Boolean(false) => Ok(None),
        Toml::String(s) => s
            .parse()
            .map(Some)
            .map_err(|_| anyhow!("{field}: `{s}`: {expected}")),
        Toml::Integer(n) => usize::try_from(*n)
            .ok()
            .filter(|&n| n >= 1)
            .map(|n| Some(StatsEvery(n)))
            .ok_or_else(|| anyhow!("{field}: {n}: {expected}")),
        other => bail!("{field}: {expected}, got {other}"),
    }
}

/// A config value resolved against the spec's directory `dir`: a preset or a format string
/// as it is, a relative file path joined to `dir`.
pub fn config_path(dir: &Path, s: &str) -> String {
    let is_preset = crate::nn::config::presets().iter().any(|(n, _)| *n == s);
    if is_preset || s.parse::<Format>().is_ok() || Path::new(s).is_absolute() {
        s.to_string()
    } else {
        dir.join(s).to_string_lossy().into_owned()
    }
}

/// A category's value: `"float32"` or `"none"` (not rounded), a format string, or a table
/// `{ format, rounding }` as in config files.
fn quant_value(v: &Toml, field: &str) -> Result<Option<QuantSpec>> {
    if v.as_str() == Some("float32") {
        return Ok(None);
    }
    let json = serde_json::to_value(v).with_context(|| format!("{field}: unreadable value"))?;
    parse_quant_spec(&json, field).map_err(|e| anyhow!("{}: {}", e.field, e.message))
}
