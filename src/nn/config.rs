//! Which numbers of a training run are rounded, and how: the per-category config.
//!
//! Low-precision training rounds six kinds of numbers, each possibly to its own format:
//!
//! | category      | what is rounded                                        | where            |
//! |---------------|--------------------------------------------------------|------------------|
//! | `weight`      | parameters as the model sees them                      | layer forward, optimizer |
//! | `activation`  | each layer's output                                    | layer forward    |
//! | `error`       | the gradient w.r.t. each layer's output                | layer backward   |
//! | `gradient`    | the gradient w.r.t. each parameter                     | optimizer        |
//! | `momentum`    | optimizer state (SGD momentum, Adam's two moments)     | optimizer        |
//! | `accumulator` | a separate copy of the weights that updates land in    | optimizer        |
//!
//! A category left out is not rounded (f32). With an accumulator the model still sees the
//! weight format: after each step the weights are set to `round_weight(accumulator)`.
//!
//! Per-layer overrides: `[[layer]]` entries whose `pattern` matches a layer name (`*` any
//! run of characters, `?` one character; `fc*` matches `fc1`, `fc2`, ...) replace the
//! categories they name, in file order (a later match wins); `"none"` switches a category
//! off for those layers. A parameter belongs to the layer named by its variable name up to
//! the last dot (`conv1.weight` → `conv1`).
//!
//! A config is a preset (`float32`: nothing rounded; `fp8`; or a format preset such as
//! `bf16` or `posit16`, meaning that format in every category but the accumulator), any
//! format string with the same meaning (`posit<16,1>`), or a TOML or JSON file with these
//! fields:
//!
//! ```toml
//! seed = 7
//! weight = "posit<16,1>"                                   # a format, nearest-even
//! gradient = { format = "posit<16,1>", rounding = "stochastic" }
//! [[layer]]
//! pattern = "fc3"
//! weight = "none"
//! ```
//!
//! `accumulate` (top level, and in `[[layer]]` entries) sets how each layer's GEMMs multiply
//! and add, in forward and backward: `"f32"` (the default), `"quire"`, `"naive"`,
//! `"naive:<format>"`, `"fma:<format>"` or `"lns:<impl>"` (the rules are in
//! [`crate::quire::accumulate`]; not to be confused with the `accumulator` category, the
//! optimizer's weight copy):
//!
//! ```toml
//! weight = "posit<16,1>"
//! activation = "posit<16,1>"
//! error = "posit<16,1>"
//! gradient = "posit<16,1>"
//! accumulate = "quire"
//! [[layer]]
//! pattern = "fc3"
//! accumulate = "naive"
//! ```
//!
//! `loss_scale` (top level only) scales the loss of a training run before its backward pass,
//! so that small errors and weight gradients stay in their format's range, and unscales the
//! weight gradients in f32 after their `gradient` rounding, before the optimizer's update
//! ([`crate::optim::loss_scale`] says exactly where the scale enters and leaves): a number is
//! a static scale, `"dynamic"` is dynamic scaling with PyTorch GradScaler's defaults, and a
//! table (or the string `"dynamic:init=...,growth_factor=...,backoff_factor=...,
//! growth_interval=..."`) sets its parameters. Absent (or `"none"`): no scaling.
//!
//! ```toml
//! error = "e4m3"
//! gradient = "e4m3"
//! loss_scale = { init = 65536.0, growth_factor = 2.0, backoff_factor = 0.5, growth_interval = 2000 }
//! ```
//!
//! `seed` is the run's seed when `qcandle train` is given no `--seed` (the flag wins when
//! given; without either the seed is 0). It seeds the initial weights, the batch order and
//! the stochastic-rounding streams.
//!
//! Stochastic rounding needs independent random streams: every (layer, category) pair gets
//! its own seed, a hash of the config seed, the layer name and the category, so runs are
//! reproducible and adding a layer does not shift the other layers' streams.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde_json::{Map, Value};

use crate::format::{Format, Rounding};
use crate::ops::Quant;
use crate::optim::{DynamicScale, LossScale, ParamQuant};
use crate::quire::Accumulate;
use crate::stats::Site;

/// A number category of low-precision training.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Category {
    /// Parameters as the model sees them.
    Weight,
    /// Layer outputs.
    Activation,
    /// Gradients w.r.t. parameters.
    Gradient,
    /// Gradients w.r.t. layer outputs (backward through activations).
    Error,
    /// Optimizer state.
    Momentum,
    /// The high-precision weight copy that updates land in.
    Accumulator,
}

impl Category {
    /// Every category, in config-file order.
    pub const ALL: [Category; 6] = [
        Category::Weight,
        Category::Activation,
        Category::Gradient,
        Category::Error,
        Category::Momentum,
        Category::Accumulator,
    ];

    /// The config-file key.
    pub fn key(self) -> &'static str {
        match self {
            Category::Weight => "weight",
            Category::Activation => "activation",
            Category::Gradient => "gradient",
            Category::Error => "error",
            Category::Momentum => "momentum",
            Category::Accumulator => "accumulator",
        }
    }
}

impl FromStr for Category {
    type Err = ConfigError;

    /// The category whose config-file key is `s` (`weight`, `activation`, ...).
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        parse_category(s, "")
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

/// A format and a rounding mode, without a random stream (the config assigns seeds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuantSpec {
    /// The target format.
    pub format: Format,
    /// The rounding mode.
    pub rounding: Rounding,
}

impl QuantSpec {
    /// `format` with nearest-even rounding.
    pub fn nearest(format: Format) -> Self {
        QuantSpec {
            format,
            rounding: Rounding::NearestEven,
        }
    }
}

/// One optional [`QuantSpec`] per category.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Categories {
    /// Parameters as the model sees them.
    pub weight: Option<QuantSpec>,
    /// Layer outputs.
    pub activation: Option<QuantSpec>,
    /// Gradients w.r.t. parameters.
    pub gradient: Option<QuantSpec>,
    /// Gradients w.r.t. layer outputs.
    pub error: Option<QuantSpec>,
    /// Optimizer state.
    pub momentum: Option<QuantSpec>,
    /// The weight copy that updates land in.
    pub accumulator: Option<QuantSpec>,
}

impl Categories {
    /// Every category set to `spec`, except the accumulator (absent).
    pub fn all(spec: QuantSpec) -> Self {
        Categories {
            weight: Some(spec),
            activation: Some(spec),
            gradient: Some(spec),
            error: Some(spec),
            momentum: Some(spec),
            accumulator: None,
        }
    }

    /// The setting of one category.
    pub fn get(&self, category: Category) -> Option<QuantSpec> {
        *self.slot(category)
    }

    /// Sets one category.
    pub fn set(&mut self, category: Category, spec: Option<QuantSpec>) {
        *self.slot_mut(category) = spec;
    }

    fn slot(&self, category: Category) -> &Option<QuantSpec> {
        match category {
            Category::Weight => &self.weight,
            Category::Activation => &self.activation,
            Category::Gradient => &self.gradient,
            Category::Error => &self.error,
            Category::Momentum => &self.momentum,
            Category::Accumulator => &self.accumulator,
        }
    }

    fn slot_mut(&mut self, category: Category) -> &mut Option<QuantSpec> {
        match category {
            Category::Weight => &mut self.weight,
            Category::Activation => &mut self.activation,
            Category::Gradient => &mut self.gradient,
            Category::Error => &mut self.error,
            Category::Momentum => &mut self.momentum,
            Category::Accumulator => &mut self.accumulator,
        }
    }
}

/// Settings that replace some categories for the layers whose name matches `pattern`.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerOverride {
    /// Glob over layer names: `*` any run of characters, `?` one character.
    pub pattern: String,
    /// The categories replaced; `None` switches the category off.
    pub set: BTreeMap<Category, Option<QuantSpec>>,
    /// The `accumulate` setting of these layers, when the entry gives one.
    pub accumulate: Option<Accumulate>,
}

/// The quantization config of a training run: one optional format per category, per-layer
/// overrides, and the seed of the stochastic-rounding streams.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QConfig {
    /// Seed from which every (layer, category) stream seed is derived.
    pub seed: u64,
    /// Settings for every layer.
    pub base: Categories,
    /// Per-layer replacements, applied in order.
    pub layers: Vec<LayerOverride>,
    /// How every layer's GEMMs multiply and add (per-layer entries may replace it).
    pub accumulate: Accumulate,
    /// Loss scaling of the backward pass (none by default; see [`crate::optim::loss_scale`]).
    pub loss_scale: LossScale,
}

/// A config that could not be read: the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config {field}: {message}")]
pub struct ConfigError {
    /// The offending field (`weight`, `layer[1].pattern`, `file`, ...).
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl ConfigError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl From<ConfigError> for candle_core::Error {
    fn from(e: ConfigError) -> Self {
        candle_core::Error::Msg(e.to_string())
    }
}

/// The presets that are not a format in every category: (name, description).
pub const CONFIG_ONLY_PRESETS: [(&str, &str); 2] = [
    ("float32", "nothing rounded"),
    (
        "fp8",
        "e4m3 weights and activations, e5m2 gradients and errors, f32 optimizer state and weight copy",
    ),
];

/// Every config preset, (name, description): [`CONFIG_ONLY_PRESETS`], then each format
/// preset of [`Format::presets`] (`bf16`, `posit16`, ...) meaning that format in every
/// category.
pub fn presets() -> Vec<(&'static str, String)> {
    let config_only = CONFIG_ONLY_PRESETS
        .iter()
        .map(|&(name, description)| (name, description.to_string()));
    let formats = Format::presets()
        .into_iter()
        .map(|(name, _, format)| (name, format!("{format} in every category")));
    config_only.chain(formats).collect()
}

impl QConfig {
    /// Nothing rounded.
    pub fn float32() -> Self {
        QConfig::default()
    }

    /// Every category except the accumulator set to `spec`.
    pub fn uniform(spec: QuantSpec) -> Self {
        QConfig {
            seed: 0,
            base: Categories::all(spec),
            layers: Vec::new(),
            accumulate: Accumulate::F32,
            loss_scale: LossScale::None,
        }
    }

    /// A named preset (see [`presets`]): `float32`, `fp8`, or a format preset name, which
    /// means that format in every category but the accumulator.
    pub fn preset(name: &str) -> Result<Self, ConfigError> {
        if let Some(config) = QConfig::config_only_preset(name) {
            return Ok(config);
        }
        match Format::presets().into_iter().find(|p| p.0 == name) {
            Some((_, _, format)) => Ok(QConfig::uniform(QuantSpec::nearest(format))),
            None => {
                let names: Vec<&str> = presets().iter().map(|p| p.0).collect();
                Err(ConfigError::new(
                    "preset",
                    format!("unknown preset `{name}`; presets: {}", names.join(", ")),
                ))
            }
        }
    }

    fn config_only_preset(name: &str) -> Option<Self> {
        let format = |s: &str| QuantSpec::nearest(s.parse().expect("preset formats parse"));
        match name {
            "float32" => Some(QConfig::float32()),
            "fp8" => Some(QConfig {
                seed: 0,
                base: Categories {
                    weight: Some(format("e4m3")),
                    activation: Some(format("e4m3")),
                    gradient: Some(format("e5m2")),
                    error: Some(format("e5m2")),
                    momentum: None,
                    accumulator: Some(format("float<8,23>")),
                },
                layers: Vec::new(),
                accumulate: Accumulate::F32,
                loss_scale: LossScale::None,
            }),
            _ => None,
        }
    }

    /// The same config with another seed.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// A config preset (see [`presets`]), a format string meaning that format in every
    /// category but the accumulator (`posit<16,1>`, `float<5,2>`), or a path to a `.toml`
    /// or `.json` file.
    pub fn load(name_or_path: &str) -> Result<Self, ConfigError> {
        if let Some(config) = QConfig::config_only_preset(name_or_path) {
            return Ok(config);
        }
        let format_error = match Format::from_str(name_or_path) {
            Ok(format) => return Ok(QConfig::uniform(QuantSpec::nearest(format))),
            Err(e) => e,
        };
        let path = Path::new(name_or_path);
        let text = std::fs::read_to_string(path).map_err(|e| {
            // A string written like a format (`posit<8,9>`) is told why it is not one.
            let why_not_format = if name_or_path.contains('<') {
                format!(" ({format_error})")
            } else {
                String::new()
            };
            ConfigError::new(
                "file",
                format!(
                    "`{name_or_path}` is neither a preset, a format{why_not_format} nor a readable file: {e}"
                ),
            )
        })?;
        match path.extension().and_then(|e| e.to_str()) {
            Some("json") => QConfig::from_json(&text),
            _ => QConfig::from_toml(&text),
        }
    }

    /// Parses a TOML config.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let value: Value =
            toml::from_str(text).map_err(|e| ConfigError::new("file", format!("TOML: {e}")))?;
        QConfig::from_value(&value)
    }

    /// Parses a JSON config.
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| ConfigError::new("file", format!("JSON: {e}")))?;
        QConfig::from_value(&value)
    }

    /// The config as TOML (parses back to an equal config).
    pub fn to_toml(&self) -> String {
        toml::to_string(&self.to_value()).expect("a config value is valid TOML")
    }

    /// The config as pretty JSON (parses back to an equal config).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(&self.to_value()).expect("a config value is valid JSON")
    }

    /// The categories of layer `name` after applying the matching overrides.
    pub fn layer(&self, name: &str) -> Categories {
        let mut categories = self.base;
        for o in self.layers.iter().filter(|o| glob_match(&o.pattern, name)) {
            for (&category, &spec) in &o.set {
                categories.set(category, spec);
            }
        }
        categories
    }

    /// The `accumulate` setting of layer `name` after applying the matching overrides.
    pub fn accumulate(&self, name: &str) -> Accumulate {
        self.layers
            .iter()
            .rev()
            .filter(|o| glob_match(&o.pattern, name))
            .find_map(|o| o.accumulate)
            .unwrap_or(self.accumulate)
    }

    /// The `[[layer]]` patterns that match none of `layer_names`, in file order, each
    /// once. Such a pattern changes nothing, which is usually a typo (`fc_1` for `fc1`)
    /// or a config written for another model; callers warn about each.
    pub fn unmatched_patterns(&self, layer_names: &[&str]) -> Vec<String> {
        let mut unmatched: Vec<String> = Vec::new();
        for o in &self.layers {
            let matches_some = layer_names.iter().any(|n| glob_match(&o.pattern, n));
            if !matches_some && !unmatched.contains(&o.pattern) {
                unmatched.push(o.pattern.clone());
            }
        }
        unmatched
    }

    /// The quantizer of `category` in layer `layer`, with its own random stream, labelled
    /// with its [`Site`].
    pub fn quant(&self, layer: &str, category: Category) -> Option<Quant> {
        let spec = self.layer(layer).get(category)?;
        Some(
            Quant::new(spec.format)
                .with_rounding(spec.rounding)
                .with_seed(stream_seed(self.seed, layer, category))
                .with_site(Site::new(layer, category.key())),
        )
    }

    /// The optimizer's quantizers for the variable `var_name` (`conv1.weight` belongs to
    /// layer `conv1`, and its quantizers are labelled with that layer's [`Site`]s).
    pub fn param_quant(&self, var_name: &str) -> ParamQuant {
        let layer = var_name.rsplit_once('.').map_or(var_name, |(l, _)| l);
        // Streams are per variable, not per layer, so a layer's weight and bias draw
        // different random bits.
        let resolved = self.layer(layer);
        let with = |c: Category| {
            resolved.get(c).map(|s| {
                Quant::new(s.format)
                    .with_rounding(s.rounding)
                    .with_seed(stream_seed(self.seed, var_name, c))
                    .with_site(Site::new(layer, c.key()))
            })
        };
        ParamQuant {
            gradient: with(Category::Gradient),
            momentum: with(Category::Momentum),
            weight: with(Category::Weight),
            accumulator: with(Category::Accumulator),
        }
    }

    /// Every variable of `varmap` with its optimizer quantizers ([`QConfig::param_quant`]),
    /// sorted by name: what [`OptimLp::new`](crate::optim::OptimLp::new) takes.
    pub fn param_quants(
        &self,
        varmap: &candle_nn::VarMap,
    ) -> candle_core::Result<Vec<(candle_core::Var, ParamQuant)>> {
        let data = varmap
            .data()
            .lock()
            .map_err(|_| candle_core::Error::Msg("poisoned var map".into()))?;
        let mut vars: Vec<(&String, &candle_core::Var)> = data.iter().collect();
        vars.sort_by(|a, b| a.0.cmp(b.0));
        Ok(vars
            .into_iter()
            .map(|(name, var)| (var.clone(), self.param_quant(name)))
            .collect())
    }

    fn from_value(value: &Value) -> Result<Self, ConfigError> {
        let map = value
            .as_object()
            .ok_or_else(|| ConfigError::new("file", "expected a table of fields"))?;
        let mut config = QConfig::default();
        for (key, v) in map {
            match key.as_str() {
                "seed" => {
                    config.seed = v
                        .as_u64()
                        .ok_or_else(|| ConfigError::new("seed", "expected an integer >= 0"))?
                }
                "accumulate" => config.accumulate = parse_accumulate(v, "accumulate")?,
                "loss_scale" => config.loss_scale = parse_loss_scale(v)?,
                "layer" | "layers" => {
                    let list = v.as_array().ok_or_else(|| {
                        ConfigError::new(key.as_str(), "expected a list of tables")
                    })?;
                    for (i, entry) in list.iter().enumerate() {
                        config
                            .layers
                            .push(parse_override(entry, &format!("layer[{i}]"))?);
                    }
                }
                other => {
                    let category = parse_category(other, "")?;
                    config.base.set(category, parse_spec(v, other)?);
                }
            }
        }
        Ok(config)
    }

    fn to_value(&self) -> Value {
        let mut map = Map::new();
        map.insert("seed".into(), Value::from(self.seed));
        // Written only when set, so configs without it keep their text (and run names).
        if !self.accumulate.is_f32() {
            map.insert(
                "accumulate".into(),
                Value::from(self.accumulate.to_string()),
            );
        }
        // Written only when set, as `accumulate`.
        match self.loss_scale {
            LossScale::None => {}
            LossScale::Static(s) => {
                map.insert("loss_scale".into(), Value::from(f64::from(s)));
            }
            dynamic => {
                map.insert("loss_scale".into(), Value::from(dynamic.to_string()));
            }
        }
        for c in Category::ALL {
            if let Some(spec) = self.base.get(c) {
                map.insert(c.key().into(), spec_value(Some(spec)));
            }
        }
        if !self.layers.is_empty() {
            let layers = self
                .layers
                .iter()
                .map(|o| {
                    let mut m = Map::new();
                    m.insert("pattern".into(), Value::from(o.pattern.clone()));
                    for (c, spec) in &o.set {
                        m.insert(c.key().into(), spec_value(*spec));
                    }
                    if let Some(a) = o.accumulate {
                        m.insert("accumulate".into(), Value::from(a.to_string()));
                    }
                    Value::Object(m)
                })
                .collect();
            map.insert("layer".into(), Value::Array(layers));
        }
        Value::Object(map)
    }
}

fn spec_value(spec: Option<QuantSpec>) -> Value {
    match spec {
        None => Value::from("none"),
        Some(s) => {
            let mut m = Map::new();
            m.insert("format".into(), Value::from(s.format.to_string()));
            m.insert("rounding".into(), Value::from(s.rounding.to_string()));
            Value::Object(m)
        }
    }
}

fn parse_category(key: &str, prefix: &str) -> Result<Category, ConfigError> {
    Category::ALL
        .into_iter()
        .find(|c| c.key() == key)
        .ok_or_else(|| {
            let keys: Vec<&str> = Category::ALL.iter().map(|c| c.key()).collect();
            ConfigError::new(
                format!("{prefix}{key}"),
                format!(
                    "unknown field; expected seed, accumulate, loss_scale, layer or one of {}",
                    keys.join(", ")
                ),
            )
        })
}

/// One category's setting as a config file writes it: `"posit<16,1>"`, `"none"` (not
/// rounded: `None`), or `{ format = "...", rounding = "..." }`. Errors name `field`.
pub fn parse_quant_spec(v: &Value, field: &str) -> Result<Option<QuantSpec>, ConfigError> {
    parse_spec(v, field)
}

/// `"posit<16,1>"`, `"none"`, or `{ format = "...", rounding = "..." }`.
fn parse_spec(v: &Value, field: &str) -> Result<Option<QuantSpec>, ConfigError> {
    let parse_format = |s: &str, field: &str| -> Result<Option<Format>, ConfigError> {
        if s == "none" {
            return Ok(None);
        }
        Format::from_str(s)
            .map(Some)
            .map_err(|e| ConfigError::new(field, e.to_string()))
    };
    match v {
        Value::String(s) => Ok(parse_format(s, field)?.map(QuantSpec::nearest)),
        Value::Object(m) => {
            let mut format = None;
            let mut rounding = Rounding::NearestEven;
            for (key, v) in m {
                let sub = format!("{field}.{key}");
                let s = v
                    .as_str()
                    .ok_or_else(|| ConfigError::new(sub.as_str(), "expected a string"))?;
                match key.as_str() {
                    "format" => format = Some(parse_format(s, &sub)?),
                    "rounding" => {
                        rounding = Rounding::from_str(s)
                            .map_err(|e| ConfigError::new(sub.as_str(), e.to_string()))?
                    }
                    _ => {
                        return Err(ConfigError::new(
                            sub,
                            "unknown field; expected format or rounding",
                        ))
                    }
                }
            }
            let format = format.ok_or_else(|| {
                ConfigError::new(format!("{field}.format"), "missing (a format or \"none\")")
            })?;
            Ok(format.map(|format| QuantSpec { format, rounding }))
        }
        _ => Err(ConfigError::new(
            field,
            "expected a format string, \"none\", or a table with format and rounding",
        )),
    }
}

fn parse_override(v: &Value, field: &str) -> Result<LayerOverride, ConfigError> {
    let map = v
        .as_object()
        .ok_or_else(|| ConfigError::new(field, "expected a table"))?;
    let mut pattern = None;
    let mut set = BTreeMap::new();
    let mut accumulate = None;
    for (key, v) in map {
        if key == "accumulate" {
            accumulate = Some(parse_accumulate(v, &format!("{field}.accumulate"))?);
        } else if key == "pattern" {
            let p = v.as_str().filter(|p| !p.is_empty()).ok_or_else(|| {
                ConfigError::new(format!("{field}.pattern"), "expected a non-empty string")
            })?;
            pattern = Some(p.to_string());
        } else {
            let category = parse_category(key, &format!("{field}."))?;
            set.insert(category, parse_spec(v, &format!("{field}.{key}"))?);
        }
    }
    let pattern = pattern.ok_or_else(|| ConfigError::new(format!("{field}.pattern"), "missing"))?;
    Ok(LayerOverride {
        pattern,
        set,
        accumulate,
    })
}

/// A `loss_scale` value: a number (a static scale), a string ([`LossScale`]'s spelling:
/// `"none"`, `"dynamic"`, `"dynamic:init=1024,growth_interval=100"`, or a number), or a table
/// of the dynamic parameters (`{ init = 1024.0, growth_interval = 100 }`, the others at
/// GradScaler's defaults). Validated.
fn parse_loss_scale(v: &Value) -> Result<LossScale, ConfigError> {
    let error = |e: candle_core::Error| ConfigError::new("loss_scale", e.to_string());
    let setting = match v {
        Value::Number(n) => {
            let x = n
                .as_f64()
                .ok_or_else(|| ConfigError::new("loss_scale", format!("{n} is not a number")))?;
            LossScale::Static(x as f32)
        }
        Value::String(s) => s.parse::<LossScale>().map_err(error)?,
        Value::Object(map) => {
            let mut d = DynamicScale::default();
            for (key, value) in map {
                let text = match value {
                    Value::Number(n) => n.to_string(),
                    other => {
                        return Err(ConfigError::new(
                            format!("loss_scale.{key}"),
                            format!("expected a number, got {other}"),
                        ))
                    }
                };
                d.set(key, &text).map_err(error)?;
            }
            LossScale::Dynamic(d)
        }
        other => {
            return Err(ConfigError::new(
                "loss_scale",
                format!(
                    "expected a number (a static scale), \"none\", \"dynamic\" or a table of \
                     dynamic parameters, got {other}"
                ),
            ))
        }
    };
    setting.validate().map_err(error)?;
    Ok(setting)
}

/// An `accumulate` value: a string such as `"quire"` or `"naive:fp16"`. Errors name `field`.
fn parse_accumulate(v: &Value, field: &str) -> Result<Accumulate, ConfigError> {
    let s = v.as_str().ok_or_else(|| {
        ConfigError::new(
            field,
            format!("expected a string: one of {}", Accumulate::SPELLINGS),
        )
    })?;
    s.parse()
        .map_err(|e: crate::quire::AccumulateError| ConfigError::new(field, e.to_string()))
}

/// Glob match with `*` (any run, possibly empty) and `?` (one character).
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let s: Vec<char> = name.chars().collect();
    // Iterative matcher with backtracking to the last `*`.
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, si));
            pi += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// The seed of the stream for (`name`, `category`): FNV-1a over the name and category,
/// mixed with the config seed by SplitMix64's finaliser.
fn stream_seed(seed: u64, name: &str, category: Category) -> u64 {
    let h = crate::philox::fnv1a(name.bytes().chain([0xff, category as u8]));
    let mut z = seed ^ h;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_with_patterns(patterns: &[&str]) -> QConfig {
        let mut text = String::new();
        for p in patterns {
            text.push_str(&format!(
                "[[layer]]\npattern = \"{p}\"\nweight = \"none\"\n"
            ));
        }
        QConfig::from_toml(&text).expect("the config parses")
    }

    const LENET5: [&str; 5] = ["conv1", "conv2", "fc1", "fc2", "fc3"];

    #[test]
    fn patterns_matching_no_layer_are_listed_in_file_order() {
        let config = config_with_patterns(&["fc*", "fc_1", "conv?", "dense*", "conv10"]);
        assert_eq!(
            config.unmatched_patterns(&LENET5),
            ["fc_1", "dense*", "conv10"]
        );
    }

    #[test]
    fn a_pattern_matching_any_one_layer_is_matched() {
        let config = config_with_patterns(&["fc3", "*2", "c*1", "*"]);
        assert!(config.unmatched_patterns(&LENET5).is_empty());
    }

    #[test]
    fn a_repeated_unmatched_pattern_is_listed_once() {
        let config = config_with_patterns(&["fc9", "fc1", "fc9"]);
        assert_eq!(config.unmatched_patterns(&LENET5), ["fc9"]);
    }

    #[test]
    fn without_layers_every_pattern_is_unmatched_and_without_patterns_none_is() {
        let config = config_with_patterns(&["fc1", "*"]);
        assert_eq!(config.unmatched_patterns(&[]), ["fc1", "*"]);
        assert!(QConfig::preset("posit8")
            .expect("a preset")
            .unmatched_patterns(&LENET5)
            .is_empty());
    }
}
