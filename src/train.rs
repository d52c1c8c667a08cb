//! The training workflow: a model of the zoo trained on a dataset under a [`QConfig`],
//! evaluated after every epoch, with results written atomically and runs that resume.
//!
//! Reproducibility: the initial weights come from a Philox stream keyed by the run seed
//! and each variable's name (PyTorch's default initialisation: weights and biases uniform
//! in ±1/√fan_in); the batch order of epoch `e` is a Philox shuffle keyed by (seed, e);
//! every stochastic quantizer restarts epoch `e` at call index `e·2^32`; the learning rate of
//! each step is the schedule's ([`crate::optim::schedule`]) at the step's index in the run. An
//! epoch's result
//! therefore depends only on the state at its start, which the checkpoint holds, and a
//! resumed run equals an uninterrupted one.
//!
//! Loss scaling (the config's `loss_scale`, [`crate::optim::loss_scale`]): each step's
//! backward pass starts from the loss times the current scale, and the optimizer unscales
//! the gradients after their `gradient` rounding ([`crate::optim::LpOptimizer::scaled_step`]);
//! under dynamic scaling a step whose gradients overflow is skipped and the scale updated.
//! The scaler's state is in the checkpoint (`scaler.scale`, `scaler.good_steps`,
//! `scaler.skipped_steps`); each epoch's record holds the scale after it and its skipped
//! steps (in `run.json` and as `metrics.csv`'s `loss_scale` and `skipped_steps` columns,
//! present only in runs that scale their loss). The reported loss is the unscaled one.
//!
//! Output directory (`--out`): `run.json` (options, config and per-epoch records),
//! `metrics.csv`, `config.toml`, `model.safetensors` (the weights as candle-nn names
//! them), `checkpoint.safetensors` (weights and optimizer state after the last finished
//! epoch) and `curves.png`; with statistics ([`train_with_stats`]), `stats.csv`,
//! `stats_hist.csv` and `stats.json` ([`crate::run_stats`]), which resume with the run.
//! Recording statistics changes no number of the training: it is not part of the run's
//! identity, and a run may be resumed with or without it.
//!
//! Run identity: a directory holds one run, named by everything that changes its results:
//! the model, the config's contents (not the spelling of its path; its `loss_scale`
//! included), the optimizer, learning
//! rate and its schedule, the weight decay and `β₂` when given, batch size, seed, training-image limit, the device's kind (`cpu` or `cuda`: their
//! convolutions and matrix products sum in different orders; `cuda:0` and `cuda:1` are the
//! same run), and the data's SHA-256 (the same images read from another directory, or
//! uncompressed, are the same data). Only the epoch count may grow: a run asked for more
//! epochs resumes from its checkpoint. Any other difference is refused, naming each setting
//! that differs.
//!
//! Device ([`TrainOptions::device`]): the variables, the optimizer state and the evaluation
//! live on it; the dataset stays in host memory and each batch is moved to the device as it
//! is gathered. A checkpoint loads onto the device, and the files written are the same f32
//! safetensors whatever the device. On a CUDA device the layers run candle's convolution and
//! matrix product with the CUDA quantize kernel (the CPU's fused convolution and pooling ops
//! have CPU kernels only; see [`crate::ops::conv2d`] and [`crate::ops::max_pool2d`]), and
//! nothing is copied back to the host during a step but the loss.
//!
//! Safety ([`crate::run_dir`]): a writer locks the directory, so a second one fails at once;
//! `run.json` records every file's SHA-256, written last so it marks a complete epoch; a
//! resumed or finished run is checked against it before its results are trusted: damaged
//! results are rewritten from an intact checkpoint, a damaged checkpoint is reported with the
//! way out.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Module, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use serde::{Deserialize, Serialize};

use crate::data::Dataset;
use crate::device::DeviceSpec;
use crate::io::{le_bytes, read_tensors, write_atomically, write_tensors};
use crate::nn::{round_vars_in_place, Model, ModelKind, QConfig};
use crate::ops::Quant;
use crate::optim::{
    AdamParams, AdamWParams, LossScaler, LpAdam, LpAdamW, LpOptimizer, LpSgd, LrSchedule,
    ParamQuant, SgdParams,
};
use crate::philox::Stream;
use crate::run_dir::{check, digests, remove_leftovers, Damage, Digests, RunLock};
use crate::run_stats::{StatsEvery, StatsLog, StatsRecorder};

/// Set by [`request_stop`]; checked before every training step.
static STOP: AtomicBool = AtomicBool::new(false);

/// Asks every training run of this process to stop before its next step (a program calls it
/// from its Ctrl-C/SIGTERM handler). A run stopped this way loses only its unfinished epoch:
/// results are saved between epochs, never interrupted by it, so the run directory stays
/// consistent and resumes. The run returns a [`Stopped`] error.
pub fn request_stop() {
    STOP.store(true, Ordering::SeqCst);
}

/// The error of a run stopped by [`request_stop`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    /// The epoch that was stopped (not saved).
    pub epoch: usize,
}

impl fmt::Display for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stopped during epoch {}; the finished epochs are saved and running again resumes",
            self.epoch
        )
    }
}

impl std::error::Error for Stopped {}

/// The optimizers `train` can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// Adam (L2 weight decay added to the gradient).
    Adam,
    /// AdamW (decoupled weight decay).
    AdamW,
    /// SGD with momentum 0.9.
    Sgd,
}

impl OptimizerKind {
    /// This optimizer over `params` at learning rate `lr`, with the other hyper-parameters
    /// at PyTorch's defaults (SGD: momentum 0.9) except those `settings` gives.
    pub fn build(
        self,
        params: Vec<(Var, ParamQuant)>,
        lr: f64,
        settings: OptimizerSettings,
    ) -> candle_core::Result<Box<dyn LpOptimizer>> {
        let beta2 = |default: f64| settings.beta2.unwrap_or(default);
        let decay = |default: f64| settings.weight_decay.unwrap_or(default);
        Ok(match self {
            OptimizerKind::Adam => {
                let d = AdamParams::default();
                Box::new(LpAdam::new(
                    params,
                    AdamParams {
                        lr,
                        beta2: beta2(d.beta2),
                        weight_decay: decay(d.weight_decay),
                        ..d
                    },
                )?)
            }
            OptimizerKind::AdamW => {
                let d = AdamWParams::default();
                Box::new(LpAdamW::new(
                    params,
                    AdamWParams {
                        lr,
                        beta2: beta2(d.beta2),
                        weight_decay: decay(d.weight_decay),
                        ..d
                    },
                )?)
            }
            OptimizerKind::Sgd => Box::new(LpSgd::new(
                params,
                SgdParams {
                    lr,
                    momentum: 0.9,
                    weight_decay: decay(0.0),
                    ..Default::default()
                },
            )?),
        })
    }
}

/// Optimizer hyper-parameters that replace the optimizer's defaults when given (`None`: the
/// default, see [`OptimizerKind::build`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct OptimizerSettings {
    /// Weight decay `λ` (Adam and SGD: L2 added to the gradient, default 0; AdamW:
    /// decoupled, default 1e-2).
    pub weight_decay: Option<f64>,
    /// The decay `β₂` of Adam's and AdamW's second moment (default 0.999); SGD has none.
    pub beta2: Option<f64>,
}

impl FromStr for OptimizerKind {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "adam" => OptimizerKind::Adam,
            "adamw" => OptimizerKind::AdamW,
            "sgd" => OptimizerKind::Sgd,
            _ => bail!("unknown optimizer `{s}`; optimizers: adam, adamw, sgd"),
        })
    }
}

impl fmt::Display for OptimizerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OptimizerKind::Adam => "adam",
            OptimizerKind::AdamW => "adamw",
            OptimizerKind::Sgd => "sgd",
        })
    }
}

/// Everything that determines a training run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainOptions {
    /// The model of the zoo (its command-line name).
    pub model: String,
    /// The config's name: a preset or the file it was read from.
    pub config_name: String,
    /// Number of epochs.
    pub epochs: usize,
    /// Mini-batch size.
    pub batch: usize,
    /// Learning rate.
    pub lr: f64,
    /// The optimizer.
    pub optimizer: OptimizerKind,
    /// Seed of initialisation, shuffling and stochastic rounding: the seed the run uses,
    /// which replaces the config's own `seed` (`qcandle train` sets it from `--seed`, else
    /// from the config's seed).
    pub seed: u64,
    /// Train on only the first this many training images (all when `None`).
    #[serde(default)]
    pub train_limit: Option<usize>,
    /// Where the model, its optimizer state and every batch live (runs written before it was
    /// recorded ran on the CPU). Its kind is part of the run's identity.
    #[serde(default)]
    pub device: DeviceSpec,
    /// The learning-rate schedule (see [`crate::optim::schedule`]). Absent from `run.json`
    /// when constant, so runs without a schedule are recorded as before schedules existed.
    #[serde(default, skip_serializing_if = "LrSchedule::is_constant")]
    pub schedule: LrSchedule,
    /// Weight decay replacing the optimizer's default when given (see
    /// [`OptimizerSettings::weight_decay`]); absent from `run.json` when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_decay: Option<f64>,
    /// Adam's and AdamW's `β₂` replacing the default 0.999 when given; absent from
    /// `run.json` when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta2: Option<f64>,
}

impl TrainOptions {
    /// Checks every option before anything is created: at least one epoch, a batch and a
    /// training-image limit of at least 1, a positive finite learning rate, a decay that
    /// ends after at least one epoch, a weight decay >= 0, a `β₂` in [0, 1) for Adam or
    /// AdamW, a known model. Names each option that is wrong. (That a decay ends after the
    /// warmup is checked once the steps per epoch are known, by [`train`].)
    pub fn validate(&self) -> Result<()> {
        let mut problems = Vec::new();
        if self.epochs == 0 {
            problems.push("epochs must be at least 1, got 0".to_string());
        }
        if self.batch == 0 {
            problems.push("batch must be at least 1, got 0".to_string());
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            problems.push(format!(
                "lr must be a positive finite number, got {}",
                self.lr
            ));
        }
        if self.train_limit == Some(0) {
            problems.push("train-limit must be at least 1, got 0".to_string());
        }
        if let Some(d) = self.schedule.decay {
            if d.epochs == 0 {
                problems.push("decay-epochs must be at least 1, got 0".to_string());
            }
        }
        if let Some(wd) = self.weight_decay {
            if !(wd.is_finite() && wd >= 0.0) {
                problems.push(format!(
                    "weight-decay must be a finite number >= 0, got {wd}"
                ));
            }
        }
        if let Some(b) = self.beta2 {
            if !(0.0..1.0).contains(&b) {
                problems.push(format!("beta2 must lie in [0, 1), got {b}"));
            }
            if self.optimizer == OptimizerKind::Sgd {
                problems.push("beta2 is a setting of adam and adamw; sgd has none".to_string());
            }
        }
        if let Err(e) = self.model.parse::<ModelKind>() {
            problems.push(e.to_string());
        }
        if !problems.is_empty() {
            bail!("invalid training options: {}", problems.join("; "));
        }
        Ok(())
    }
}

/// The results of one epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochRecord {
    /// 1-based epoch number.
    pub epoch: usize,
    /// Mean training loss over the epoch's batches.
    pub train_loss: f64,
    /// Mean test loss.
    pub test_loss: f64,
    /// Test top-1 accuracy in percent.
    pub top1: f64,
    /// Test top-5 accuracy in percent.
    pub top5: f64,
    /// Wall-clock seconds of the epoch's training steps.
    pub seconds: f64,
    /// The loss scale after the epoch's last step; runs with loss scaling only (absent from
    /// `run.json` and `metrics.csv` otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<f32>,
    /// The epoch's steps skipped because a gradient overflowed (dynamic loss scaling); runs
    /// with loss scaling only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped_steps: Option<u64>,
}

/// A run's options, config and records, as stored in `run.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    /// The run's options.
    pub options: TrainOptions,
    /// The quantization config, as TOML.
    pub config: String,
    /// Where the dataset came from (its directory, or `embedded`).
    pub data: String,
    /// The dataset's name (`fashion-mnist`, `mnist`; empty in runs written before it was
    /// recorded).
    #[serde(default)]
    pub dataset: String,
    /// SHA-256 of the data as given to [`train`] (before the training-image limit; see
    /// [`data_digest`]); empty in runs written before it was recorded.
    #[serde(default)]
    pub data_sha256: String,
    /// One record per finished epoch.
    pub epochs: Vec<EpochRecord>,
    /// The SHA-256 of every file the run wrote (empty in runs written before they were
    /// recorded).
    #[serde(default)]
    pub files: Digests,
}

impl RunRecord {
    /// The train-loss and test top-1 curves (per epoch), labelled `label`.
    pub fn curves(&self, label: &str) -> (crate::plot::Series, crate::plot::Series) {
        let series = |value: fn(&EpochRecord) -> f64| {
            let points = self.epochs.iter().map(|e| (e.epoch as f64, value(e)));
            crate::plot::Series::new(label, points.collect())
        };
        (series(|e| e.train_loss), series(|e| e.top1))
    }
}

/// A model being trained with its variables and optimizer.
pub struct Trainer {
    options: TrainOptions,
    config: QConfig,
    varmap: VarMap,
    model: Model,
    optimizer: Box<dyn LpOptimizer>,
    quants: Vec<Quant>,
    /// The opened `options.device`: the variables, optimizer state and batches live here.
    device: Device,
    /// The statistics being recorded, when enabled.
    stats: Option<StatsRecorder>,
    /// The loss scaling state, when the config scales the loss.
    scaler: Option<LossScaler>,
}

/// Variable names in a fixed order (the var map is a hash map).
fn sorted_vars(varmap: &VarMap) -> Result<Vec<(String, Var)>> {
    let data = varmap
        .data()
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned var map"))?;
    let mut vars: Vec<(String, Var)> = data.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(vars)
}

/// PyTorch's default initialisation from a Philox stream keyed by the seed and the name:
/// uniform in ±1/√fan_in, fan_in = the product of all dimensions but the first (the
/// weight's) or, for a bias, its weight's fan-in. A layer whose weight is 1-D is a
/// normalisation: its gain starts at 1 and its bias at 0.
pub fn init_vars(varmap: &VarMap, seed: u64) -> Result<()> {
    let vars = sorted_vars(varmap)?;
    for (name, var) in &vars {
        let layer = name.rsplit_once('.').map_or(name.as_str(), |p| p.0);
        let weight = vars
            .iter()
            .find(|(n, _)| *n == format!("{layer}.weight"))
            .map_or(var, |p| &p.1);
        let dims = weight.dims();
        if dims.len() == 1 {
            // A normalisation layer (its weight is a gain): gain 1, bias 0.
            let start: f32 = if name.ends_with(".weight") { 1.0 } else { 0.0 };
            var.set(&Tensor::full(start, var.shape(), var.device())?.to_dtype(var.dtype())?)?;
            continue;
        }
        let fan_in: usize = dims.iter().skip(1).product::<usize>().max(1);
        let bound = 1.0 / (fan_in as f64).sqrt();
        let n = var.elem_count();
        let mut bits = vec![0u32; n.div_ceil(4) * 4];
        Stream::new(seed, crate::philox::fnv1a(name.bytes())).fill(0, &mut bits);
        let values: Vec<f32> = bits[..n]
            .iter()
            .map(|&b| ((f64::from(b) + 0.5) / 4294967296.0 * 2.0 - 1.0) * bound)
            .map(|x| x as f32)
            .collect();
        var.set(&Tensor::from_vec(values, var.shape(), var.device())?)?;
    }
    Ok(())
}

impl Trainer {
    /// A freshly initialised model and optimizer on `options.device` (an error naming the
    /// device when it cannot be opened); `options.seed` replaces `config.seed`. The initial
    /// weights are the same bits on every device.
    pub fn new(options: TrainOptions, config: QConfig) -> Result<Self> {
        let kind: ModelKind = options.model.parse()?;
        let config = config.with_seed(options.seed);
        let device = options.device.open()?;
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
        let model = kind.build(vb, &config)?;
        init_vars(&varmap, options.seed)?;
        round_vars_in_place(&varmap, &config)?;
        let params: Vec<(Var, ParamQuant)> = sorted_vars(&varmap)?
            .into_iter()
            .map(|(name, var)| (var, config.param_quant(&name)))
            .collect();
        let mut quants = model.quants();
        for (_, p) in &params {
            quants.extend(
                [&p.gradient, &p.momentum, &p.weight, &p.accumulator]
                    .into_iter()
                    .flatten()
                    .cloned(),
            );
        }
        let settings = OptimizerSettings {
            weight_decay: options.weight_decay,
            beta2: options.beta2,
        };
        let optimizer = options.optimizer.build(params, options.lr, settings)?;
        let scaler = LossScaler::new(config.loss_scale)?;
        Ok(Trainer {
            options,
            config,
            varmap,
            model,
            optimizer,
            quants,
            device,
            stats: None,
            scaler,
        })
    }

    /// Records rounding statistics from now on, every `every` steps and at each epoch's last
    /// step (see [`crate::run_stats`]): a collector per (layer, category) is attached to the
    /// model's quantizers, except the forward rounding of the weights (which the optimizer
    /// keeps on their grid, so it changes nothing), and to the optimizer's. CPU only: an error
    /// on another device.
    pub fn enable_stats(&mut self, every: StatsEvery) -> Result<()> {
        if !self.device.is_cpu() {
            bail!(
                "rounding statistics are recorded on the CPU only; train without --stats on {}",
                self.options.device
            );
        }
        let model_quants = self.model.quants().len();
        let observed: Vec<Quant> = self.quants[..model_quants]
            .iter()
            .filter(|q| q.site().is_none_or(|s| s.category != "weight"))
            .chain(&self.quants[model_quants..])
            .cloned()
            .collect();
        self.stats = Some(StatsRecorder::attach(every, &observed));
        Ok(())
    }

    /// The statistics samples of the epoch just trained (empty without statistics).
    pub fn take_stats_samples(&mut self) -> Vec<crate::run_stats::Sample> {
        self.stats
            .as_mut()
            .map_or_else(Vec::new, StatsRecorder::take_samples)
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The model's variables.
    pub fn varmap(&self) -> &VarMap {
        &self.varmap
    }

    /// The device the model, its optimizer state and its batches live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The names of the model's layers (its variables' names without the last part:
    /// `fc1` for `fc1.weight`), sorted, each once; what config `[[layer]]` patterns match.
    pub fn layer_names(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = sorted_vars(&self.varmap)?
            .into_iter()
            .map(|(n, _)| n.rsplit_once('.').map_or(n.clone(), |p| p.0.to_string()))
            .collect();
        names.dedup();
        Ok(names)
    }

    /// Trains one epoch (1-based `epoch`), calling `progress` after each batch with the
    /// batch index, the batch count and the running mean loss. Each step runs at the rate
    /// the options' schedule gives its index in the run (epochs before `epoch` counted as
    /// full epochs of this one's batch count). Returns the mean loss.
    pub fn train_epoch(
        &mut self,
        data: &Dataset,
        epoch: usize,
        mut progress: impl FnMut(usize, usize, f64),
    ) -> Result<f64> {
        for q in &self.quants {
            q.set_calls((epoch as u64) << 32);
        }
        let batches = data.train_batches(self.options.batch, epoch, self.options.seed)?;
        let count = batches.len();
        let mut total = 0.0;
        if let Some(stats) = &mut self.stats {
            stats.discard();
        }
        let first_step = (epoch - 1) * count;
        for (i, batch) in batches.enumerate() {
            if STOP.load(Ordering::SeqCst) {
                return Err(Stopped { epoch }.into());
            }
            let lr = self
                .options
                .schedule
                .lr(self.options.lr, first_step + i, count);
            self.optimizer.set_learning_rate(lr);
            let (images, labels) = batch?;
            let loss = f64::from(self.train_step(&images, &labels, epoch, i + 1, count)?);
            if !loss.is_finite() {
                bail!("epoch {epoch}, batch {i}: the training loss is {loss}");
            }
            total += loss;
            progress(i + 1, count, total / (i + 1) as f64);
        }
        Ok(total / count.max(1) as f64)
    }

    /// [`Trainer::step`] as step `step` (1-based) of the `steps` of `epoch`: with statistics
    /// enabled, a sampled step is recorded (collectors switched on for it only). Returns the
    /// batch's loss.
    pub fn train_step(
        &mut self,
        images: &Tensor,
        labels: &Tensor,
        epoch: usize,
        step: usize,
        steps: usize,
    ) -> Result<f32> {
        let sampled = self
            .stats
            .as_ref()
            .is_some_and(|s| s.every().is_sampled(step, steps));
        if let Some(stats) = self.stats.as_ref().filter(|_| sampled) {
            stats.set_on(true);
        }
        let loss = self.step(images, labels);
        if let Some(stats) = self.stats.as_mut().filter(|_| sampled) {
            stats.set_on(false);
            stats.collect(epoch, step, steps);
        }
        loss
    }

    /// One training step on a batch: forward, cross-entropy loss, backward, optimizer
    /// step. The batch is moved to the trainer's [device](Self::device) first (nothing is
    /// copied when it is there). With loss scaling (the config's `loss_scale`) the backward
    /// pass starts from the loss times the scale, the optimizer unscales the gradients after
    /// their `gradient` rounding, and under dynamic scaling a step whose gradients overflow
    /// is skipped and the scale updated ([`crate::optim::loss_scale`]). Returns the batch's
    /// (unscaled) loss.
    pub fn step(&mut self, images: &Tensor, labels: &Tensor) -> Result<f32> {
        let images = images.to_device(&self.device)?;
        let labels = labels.to_device(&self.device)?;
        let logits = self.model.forward(&images)?;
        let loss = candle_nn::loss::cross_entropy(&logits, &labels)?;
        match &mut self.scaler {
            None => {
                let grads = loss.backward()?;
                self.optimizer.step(&grads)?;
            }
            Some(scaler) => {
                let scale = scaler.scale();
                let factor = Tensor::new(scale, loss.device())?.to_dtype(loss.dtype())?;
                let grads = loss.mul(&factor)?.backward()?;
                let taken = self
                    .optimizer
                    .scaled_step(&grads, scale, scaler.checks_overflow())?;
                scaler.update(taken)?;
            }
        }
        Ok(loss.to_scalar::<f32>()?)
    }

    /// The loss scaling state (`None` when the config does not scale the loss).
    pub fn loss_scaler(&self) -> Option<&LossScaler> {
        self.scaler.as_ref()
    }

    /// Test loss, top-1 and top-5 accuracy (percent) on the dataset's test split.
    pub fn evaluate(&self, data: &Dataset) -> Result<(f64, f64, f64)> {
        evaluate(&self.model, data, &self.device)
    }

    fn checkpoint_tensors(&self) -> Result<Vec<(String, Tensor)>> {
        let mut tensors: Vec<(String, Tensor)> = sorted_vars(&self.varmap)?
            .into_iter()
            .map(|(n, v)| (format!("model.{n}"), v.as_tensor().clone()))
            .collect();
        for (n, t) in self.optimizer.state_tensors()? {
            tensors.push((format!("optim.{n}"), t));
        }
        if let Some(scaler) = &self.scaler {
            let (scale, good, skipped) = scaler.state();
            let cpu = Device::Cpu;
            tensors.push((SCALER_SCALE.to_string(), Tensor::new(scale, &cpu)?));
            tensors.push((SCALER_GOOD.to_string(), Tensor::new(good as i64, &cpu)?));
            tensors.push((
                SCALER_SKIPPED.to_string(),
                Tensor::new(skipped as i64, &cpu)?,
            ));
        }
        Ok(tensors)
    }

    fn load_checkpoint(&mut self, tensors: Vec<(String, Tensor)>) -> Result<()> {
        let vars = sorted_vars(&self.varmap)?;
        let mut state = Vec::new();
        let mut scaler_state = Vec::new();
        let mut seen = 0;
        for (name, t) in tensors {
            if let Some(var_name) = name.strip_prefix("model.") {
                let (_, var) = vars.iter().find(|(n, _)| n == var_name).with_context(|| {
                    format!("checkpoint variable `{var_name}` is not in the model")
                })?;
                if var.dims() != t.dims() {
                    bail!(
                        "checkpoint variable `{var_name}` has shape {:?}, the model {:?}",
                        t.dims(),
                        var.dims()
                    );
                }
                var.set(&t.to_dtype(DType::F32)?.to_device(var.device())?)?;
                seen += 1;
            } else if let Some(n) = name.strip_prefix("optim.") {
                state.push((n.to_string(), t));
            } else if name.starts_with("scaler.") {
                scaler_state.push((name, t));
            }
        }
        self.load_scaler_state(scaler_state)?;
        if seen != vars.len() {
            bail!(
                "the checkpoint holds {seen} of the model's {} variables",
                vars.len()
            );
        }
        self.optimizer.load_state_tensors(state)?;
        Ok(())
    }
}

/// Checkpoint entries of the loss scaler: the scale (an f32 scalar), the steps since the last
/// overflow or growth and the skipped steps (i64 scalars).
const SCALER_SCALE: &str = "scaler.scale";
const SCALER_GOOD: &str = "scaler.good_steps";
const SCALER_SKIPPED: &str = "scaler.skipped_steps";

impl Trainer {
    /// Restores the loss scaler from its checkpoint entries: all three for a run with loss
    /// scaling, none for one without.
    fn load_scaler_state(&mut self, entries: Vec<(String, Tensor)>) -> Result<()> {
        let Some(scaler) = &mut self.scaler else {
            if let Some((name, _)) = entries.first() {
                bail!("checkpoint entry `{name}` is loss-scaler state, and the run scales no loss");
            }
            return Ok(());
        };
        let find = |key: &str| -> Result<&Tensor> {
            entries
                .iter()
                .find(|(n, _)| n == key)
                .map(|(_, t)| t)
                .with_context(|| format!("the checkpoint lacks `{key}`, the loss scaler's state"))
        };
        let count = |key: &str| -> Result<u64> {
            let v = find(key)?.to_dtype(DType::I64)?.to_scalar::<i64>()?;
            u64::try_from(v).with_context(|| format!("checkpoint entry `{key}` is negative: {v}"))
        };
        let scale = find(SCALER_SCALE)?
            .to_dtype(DType::F32)?
            .to_scalar::<f32>()?;
        scaler.restore((scale, count(SCALER_GOOD)?, count(SCALER_SKIPPED)?))?;
        if let Some((name, _)) = entries
            .iter()
            .find(|(n, _)| ![SCALER_SCALE, SCALER_GOOD, SCALER_SKIPPED].contains(&n.as_str()))
        {
            bail!("unknown checkpoint entry `{name}`");
        }
        Ok(())
    }
}

/// Test loss, top-1 and top-5 accuracy (percent) of `model` on the test split, each batch
/// moved to `device` (where the model's variables are) as it is read.
pub fn evaluate(model: &dyn Module, data: &Dataset, device: &Device) -> Result<(f64, f64, f64)> {
    let (mut loss, mut top1, mut top5, mut n) = (0.0, 0usize, 0usize, 0usize);
    for batch in data.test_batches(1000)? {
        let (images, labels) = batch?;
        let (images, labels) = (images.to_device(device)?, labels.to_device(device)?);
        let logits = model.forward(&images)?;
        let b = labels.dim(0)?;
        loss += f64::from(candle_nn::loss::cross_entropy(&logits, &labels)?.to_scalar::<f32>()?)
            * b as f64;
        let logits = logits.to_vec2::<f32>()?;
        let labels = labels.to_vec1::<u32>()?;
        for (row, &label) in logits.iter().zip(&labels) {
            let rank = rank_of(row, label as usize);
            top1 += usize::from(rank < 1);
            top5 += usize::from(rank < 5);
        }
        n += b;
    }
    let pct = |k: usize| 100.0 * k as f64 / n.max(1) as f64;
    Ok((loss / n.max(1) as f64, pct(top1), pct(top5)))
}

/// The position of class `target` when the logits are sorted in decreasing order by a
/// stable sort: classes with a larger logit, and classes with an equal logit and a lower
/// index, come first. A NaN logit ranks last (a NaN target is never in the top k).
pub fn rank_of<T: PartialOrd + Copy>(logits: &[T], target: usize) -> usize {
    let t = logits[target];
    if t.partial_cmp(&t).is_none() {
        // NaN
        return logits.len();
    }
    logits
        .iter()
        .enumerate()
        .filter(|&(i, &x)| x > t || (x == t && i < target))
        .count()
}

/// Trains per `options` and `config` on `data`, writing results under `out` (if any) after
/// every epoch and resuming from `out`'s checkpoint when it holds the same run (see the
/// module docs for what makes a run the same and how its files are checked). Everything is
/// validated before `out` is created or locked. `quiet` hides the progress bar (notes about
/// the directory are still printed to standard error). The run's seed is `options.seed`,
/// which replaces `config.seed` (see [`TrainOptions::seed`]). Returns the per-epoch records.
pub fn train(
    data: &Dataset,
    options: &TrainOptions,
    config: &QConfig,
    out: Option<&Path>,
    quiet: bool,
) -> Result<Vec<EpochRecord>> {
    train_with_stats(data, options, config, out, quiet, None)
}

/// [`train`], recording rounding statistics every `stats` steps when given (see
/// [`crate::run_stats`]): written to `out` with each epoch's results and resumed with the run.
/// The statistics of epochs finished before are kept whether or not `stats` is given now;
/// recording them changes no number of the training.
pub fn train_with_stats(
    data: &Dataset,
    options: &TrainOptions,
    config: &QConfig,
    out: Option<&Path>,
    quiet: bool,
    stats: Option<StatsEvery>,
) -> Result<Vec<EpochRecord>> {
    options.validate()?;
    let kind: ModelKind = options.model.parse()?;
    kind.check_input(data.train_images.dims())?;
    let limited;
    let train_data = match options.train_limit {
        Some(n) => {
            limited = data.subset(n, usize::MAX)?;
            &limited
        }
        None => data,
    };
    let steps_per_epoch = train_data.train_len().div_ceil(options.batch);
    if let Err(e) = options.schedule.validate(steps_per_epoch) {
        bail!("invalid training options: {e}");
    }
    let mut trainer = Trainer::new(options.clone(), config.clone())?;
    if let Some(every) = stats {
        trainer.enable_stats(every)?;
    }
    let mut stats_log = StatsLog::default();
    let layers = trainer.layer_names()?;
    let layer_refs: Vec<&str> = layers.iter().map(String::as_str).collect();
    for pattern in config.unmatched_patterns(&layer_refs) {
        note(&format!(
            "warning: the config's [[layer]] pattern `{pattern}` matches no layer of {} \
             (its layers: {}); it changes nothing",
            options.model,
            layers.join(", ")
        ));
    }
    let mut record = RunRecord {
        options: options.clone(),
        config: trainer.config.to_toml(),
        data: data.source.clone(),
        dataset: data.name.as_str().to_string(),
        data_sha256: String::new(),
        epochs: Vec::new(),
        files: Digests::new(),
    };
    let lock = out.map(RunLock::acquire).transpose()?;
    if let Some(lock) = &lock {
        let dir = lock.dir();
        // Only a run directory needs the data's identity: hashing is not free on full
        // datasets, and a run without `out` is never compared with another.
        record.data_sha256 = data_digest(data)?;
        let removed = remove_leftovers(lock)?;
        if !removed.is_empty() {
            note(&format!(
                "{}: removed what an interrupted write left: {}",
                dir.display(),
                removed.join(", ")
            ));
        }
        if let Some((previous, damage)) = resumable(dir, &record)? {
            let checkpoint = dir.join(CHECKPOINT);
            let tensors = read_tensors(&checkpoint).with_context(|| {
                format!(
                    "cannot resume {}: {} is unreadable; delete the directory to train the run \
                     again",
                    dir.display(),
                    checkpoint.display()
                )
            })?;
            trainer
                .load_checkpoint(tensors)
                .with_context(|| format!("cannot resume {} from {CHECKPOINT}", dir.display()))?;
            record.epochs = previous.epochs;
            record.files = previous.files;
            stats_log = resumed_stats(dir, &record, &damage);
            if !damage.is_empty() {
                save_run(dir, &trainer, &mut record, &stats_log)?;
                // Damaged statistics were reported by `resumed_stats`: they are not rebuilt.
                let what: Vec<String> = damage
                    .iter()
                    .filter(|d| !crate::run_stats::FILES.contains(&d.file()))
                    .map(|d| d.to_string())
                    .collect();
                if !what.is_empty() {
                    note(&format!(
                        "{}: {}; rewritten from the checkpoint",
                        dir.display(),
                        what.join(", ")
                    ));
                }
            }
            if !quiet && !record.epochs.is_empty() {
                note(&format!(
                    "resuming {} after epoch {}",
                    dir.display(),
                    record.epochs.len()
                ));
            }
        }
    }
    for epoch in record.epochs.len() + 1..=options.epochs {
        let bar = progress_bar(quiet, epoch, options.epochs);
        let skipped_before = trainer.loss_scaler().map(LossScaler::skipped);
        let start = Instant::now();
        let train_loss = trainer.train_epoch(train_data, epoch, |i, n, loss| {
            bar.set_length(n as u64);
            bar.set_position(i as u64);
            bar.set_message(format!("loss {loss:.4}"));
        })?;
        let seconds = start.elapsed().as_secs_f64();
        let (test_loss, top1, top5) = trainer.evaluate(train_data)?;
        let scaler = trainer.loss_scaler();
        let loss_scale = scaler.map(LossScaler::scale);
        let skipped_steps = scaler.zip(skipped_before).map(|(s, b)| s.skipped() - b);
        let scaling = match (loss_scale, skipped_steps) {
            (Some(s), Some(n)) => format!("  loss scale {s} ({n} steps skipped)"),
            _ => String::new(),
        };
        bar.finish_with_message(format!(
            "loss {train_loss:.4}  test top-1 {top1:.2}%  top-5 {top5:.2}%{scaling}"
        ));
        record.epochs.push(EpochRecord {
            epoch,
            train_loss,
            test_loss,
            top1,
            top5,
            seconds,
            loss_scale,
            skipped_steps,
        });
        stats_log.samples.extend(trainer.take_stats_samples());
        if let Some(lock) = &lock {
            save_run(lock.dir(), &trainer, &mut record, &stats_log)?;
        }
    }
    Ok(record.epochs)
}

/// A line on standard error that never panics (a closed or full stderr loses the note, not
/// the run).
fn note(text: &str) {
    let _ = writeln!(std::io::stderr(), "{text}");
}

/// Elements hashed per step by [`data_digest`] (bounds its memory).
const DIGEST_CHUNK: usize = 1 << 16;

/// SHA-256 of a dataset's contents: the shapes and values of its training and test images
/// and labels, in that order. Equal for the same data read from any directory, compressed
/// or not; any changed image or label changes it.
pub fn data_digest(data: &Dataset) -> Result<String> {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for tensor in [
        &data.train_images,
        &data.train_labels,
        &data.test_images,
        &data.test_labels,
    ] {
        hasher.update(format!("{:?}{:?};", tensor.dtype(), tensor.dims()).as_bytes());
        // Labels are hashed as u32, everything else as f32.
        let hashed = match tensor.dtype() {
            DType::U32 => DType::U32,
            _ => DType::F32,
        };
        let flat = tensor.flatten_all()?;
        let n = flat.elem_count();
        for start in (0..n).step_by(DIGEST_CHUNK) {
            let part = flat.narrow(0, start, DIGEST_CHUNK.min(n - start))?;
            hasher.update(le_bytes(&part.to_dtype(hashed)?)?);
        }
    }
    Ok(crate::run_dir::hex(&hasher.finalize()))
}

fn progress_bar(quiet: bool, epoch: usize, epochs: usize) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(0);
    let style = indicatif::ProgressStyle::with_template(
        "epoch {prefix} [{bar:30}] {pos}/{len} {elapsed_precise} {msg}",
    )
    .expect("a valid template")
    .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(format!("{epoch}/{epochs}"));
    bar
}

/// The run record (`run.json`) of a run directory, as written (its files unchecked).
pub fn load_run(dir: &Path) -> Result<RunRecord> {
    let path = dir.join("run.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a run record (damaged or truncated)",
            path.display()
        )
    })
}

/// The run record of a run directory after checking that every file it lists is present
/// and unchanged, for reporting its results. A damaged file is named, with the way to
/// rewrite it.
pub fn load_checked_run(dir: &Path) -> Result<RunRecord> {
    let record = load_run(dir)?;
    let damage = check(dir, &record.files);
    if !damage.is_empty() {
        let what: Vec<String> = damage.iter().map(|d| d.to_string()).collect();
        bail!(
            "{}: {}; running the same `qcandle train` command again rewrites it from the \
             checkpoint",
            dir.display(),
            what.join(", ")
        );
    }
    Ok(record)
}

/// The checkpoint's file name in a run directory.
const CHECKPOINT: &str = "checkpoint.safetensors";

/// The files a run writes after every epoch, checked by their digests. `run.json` is
/// written after them and lists them.
const RUN_FILES: [&str; 5] = [
    "model.safetensors",
    CHECKPOINT,
    "config.toml",
    "metrics.csv",
    "curves.png",
];

/// Every setting in which `previous` and `current` differ as runs (the epoch count and the
/// config's label are not settings of the run), described for the user.
pub fn identity_differences(previous: &RunRecord, current: &RunRecord) -> Vec<String> {
    let (p, c) = (&previous.options, &current.options);
    let mut diffs = Vec::new();
    let mut differ = |name: &str, was: String, now: String| {
        if was != now {
            diffs.push(format!("{name}: {was} in the directory, {now} now"));
        }
    };
    differ("model", p.model.clone(), c.model.clone());
    differ(
        "optimizer",
        p.optimizer.to_string(),
        c.optimizer.to_string(),
    );
    // Bits, not values: `{:?}` of an f64 is its shortest round-trip spelling.
    differ("lr", format!("{:?}", p.lr), format!("{:?}", c.lr));
    differ(
        "lr schedule",
        p.schedule.to_string(),
        c.schedule.to_string(),
    );
    let default =
        |x: Option<f64>| x.map_or("the optimizer's default".to_string(), |x| format!("{x:?}"));
    differ(
        "weight-decay",
        default(p.weight_decay),
        default(c.weight_decay),
    );
    differ("beta2", default(p.beta2), default(c.beta2));
    differ("batch", p.batch.to_string(), c.batch.to_string());
    differ("seed", p.seed.to_string(), c.seed.to_string());
    let limit = |l: Option<usize>| l.map_or("none (all images)".to_string(), |n| n.to_string());
    differ("train-limit", limit(p.train_limit), limit(c.train_limit));
    // The kind, not the number: every GPU of a kind computes alike.
    differ(
        "device",
        p.device.kind().to_string(),
        c.device.kind().to_string(),
    );
    if !previous.dataset.is_empty() {
        differ("dataset", previous.dataset.clone(), current.dataset.clone());
    }
    if previous.data_sha256.is_empty() {
        // Written before the data digest was recorded: the source is all there is.
        differ("data", previous.data.clone(), current.data.clone());
    }
    if previous.config != current.config {
        diffs.push(format!(
            "config: the contents of `{}` differ from those of `{}` the run used",
            c.config_name, p.config_name
        ));
    }
    if !previous.data_sha256.is_empty() && previous.data_sha256 != current.data_sha256 {
        diffs.push(format!(
            "data: the images or labels in {} differ from those the run used ({})",
            current.data, previous.data
        ));
    }
    diffs
}

/// The previous run in `dir` and its damaged files, if `dir` holds a run: an error if it is
/// another run (naming what differs), asks for fewer epochs than it finished, or cannot be
/// resumed (a missing or damaged checkpoint, an unreadable run.json).
fn resumable(dir: &Path, current: &RunRecord) -> Result<Option<(RunRecord, Vec<Damage>)>> {
    if !dir.join("run.json").exists() {
        // A fresh directory, or a first epoch killed before run.json: nothing finished.
        return Ok(None);
    }
    let previous = load_run(dir).with_context(|| {
        format!(
            "cannot resume {}; delete the directory to train the run again",
            dir.display()
        )
    })?;
    let differences = identity_differences(&previous, current);
    if !differences.is_empty() {
        bail!(
            "{} holds a different run:\n  {}\nchoose another output directory or delete this one",
            dir.display(),
            differences.join("\n  ")
        );
    }
    let (done, asked) = (previous.epochs.len(), current.options.epochs);
    if done > asked {
        bail!(
            "{} already holds {done} finished epochs, more than the {asked} asked for: ask for \
             {done} or more epochs, or choose another output directory",
            dir.display()
        );
    }
    let damage = check(dir, &previous.files);
    // Runs written before digests were recorded list no files: check presence only.
    let checkpoint_damage = damage
        .iter()
        .find(|d| d.file() == CHECKPOINT)
        .cloned()
        .or_else(|| {
            (previous.files.is_empty() && !dir.join(CHECKPOINT).exists())
                .then(|| Damage::Missing(CHECKPOINT.to_string()))
        });
    if let Some(what) = checkpoint_damage {
        bail!(
            "cannot resume {}: {what}; the {done} finished epochs cannot be continued without \
             it: delete the directory to train the run again",
            dir.display()
        );
    }
    Ok(Some((previous, damage)))
}

/// The statistics of the finished epochs of the run being resumed in `dir`: read back from
/// its files when `record` lists them and they are intact, else none (with a note naming
/// what was lost: statistics cannot be rebuilt from the checkpoint).
fn resumed_stats(dir: &Path, record: &RunRecord, damage: &[Damage]) -> StatsLog {
    let listed = crate::run_stats::FILES
        .iter()
        .any(|f| record.files.contains_key(*f));
    if !listed {
        return StatsLog::default();
    }
    let lost = |why: String| {
        note(&format!(
            "{}: {why}; the rounding statistics of epochs 1 to {} are lost (statistics cannot be \
             rebuilt from the checkpoint), later epochs are recorded as usual",
            dir.display(),
            record.epochs.len()
        ));
        StatsLog::default()
    };
    if let Some(d) = damage
        .iter()
        .find(|d| crate::run_stats::FILES.contains(&d.file()))
    {
        return lost(d.to_string());
    }
    let read = |name: &str| std::fs::read_to_string(dir.join(name));
    let parsed = read("stats.csv")
        .and_then(|s| Ok((s, read("stats_hist.csv")?)))
        .map_err(anyhow::Error::from)
        .and_then(|(s, h)| StatsLog::parse(&s, &h));
    match parsed {
        Ok(mut log) => {
            log.truncate_to(record.epochs.len());
            log
        }
        Err(e) => lost(format!("{e:#}")),
    }
}

/// Writes the model, checkpoint, config, metrics and curves of `record` and the statistics
/// of `stats` (when it holds any), then `run.json` listing their digests (last: it marks the
/// epoch as complete).
fn save_run(dir: &Path, trainer: &Trainer, record: &mut RunRecord, stats: &StatsLog) -> Result<()> {
    let model: Vec<(String, Tensor)> = sorted_vars(&trainer.varmap)?
        .into_iter()
        .map(|(n, v)| (n, v.as_tensor().clone()))
        .collect();
    write_tensors(&dir.join("model.safetensors"), &model)?;
    write_tensors(&dir.join(CHECKPOINT), &trainer.checkpoint_tensors()?)?;
    write_text(&dir.join("config.toml"), &record.config)?;
    write_text(&dir.join("metrics.csv"), &metrics_csv(&record.epochs))?;
    let (loss, accuracy) = record.curves(&format!(
        "{} {}",
        record.options.model, record.options.config_name
    ));
    crate::plot::training_curves(
        &format!("{} on {}", record.options.model, record.data),
        &[loss],
        &[accuracy],
        &dir.join("curves.png"),
    )?;
    let mut files = RUN_FILES.to_vec();
    if stats.samples.is_empty() {
        // Files of statistics that were lost (damaged) are not results any more.
        for name in crate::run_stats::FILES {
            match std::fs::remove_file(dir.join(name)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("cannot remove {name}"));
                }
                _ => {}
            }
        }
    } else {
        write_text(&dir.join("stats.csv"), &stats.stats_csv())?;
        write_text(&dir.join("stats_hist.csv"), &stats.hist_csv())?;
        let summary = crate::run_stats::summary::summary_json(stats);
        write_text(&dir.join("stats.json"), &summary)?;
        files.extend(crate::run_stats::FILES);
    }
    record.files = digests(dir, &files)?;
    write_text(
        &dir.join("run.json"),
        &serde_json::to_string_pretty(record)?,
    )?;
    Ok(())
}

/// The records as CSV: `epoch,train_loss,test_loss,top1,top5,seconds`, and
/// `loss_scale,skipped_steps` (the scale after the epoch and the epoch's skipped steps) when
/// the run scales its loss.
pub fn metrics_csv(records: &[EpochRecord]) -> String {
    let scaled = records.iter().any(|r| r.loss_scale.is_some());
    let mut csv = String::from("epoch,train_loss,test_loss,top1,top5,seconds");
    csv.push_str(if scaled {
        ",loss_scale,skipped_steps\n"
    } else {
        "\n"
    });
    for r in records {
        csv.push_str(&format!(
            "{},{:.6},{:.6},{:.2},{:.2},{:.3}",
            r.epoch, r.train_loss, r.test_loss, r.top1, r.top5, r.seconds
        ));
        if scaled {
            let scale = r.loss_scale.map_or(String::new(), |s| s.to_string());
            let skipped = r.skipped_steps.map_or(String::new(), |n| n.to_string());
            csv.push_str(&format!(",{scale},{skipped}"));
        }
        csv.push('\n');
    }
    csv
}

fn write_text(path: &Path, text: &str) -> Result<()> {
    write_atomically(path, |tmp| {
        std::fs::write(tmp, text).with_context(|| format!("cannot write {}", tmp.display()))
    })
}

/// The default output directory of a run: `runs/<model>-<data>-<config>-s<seed>`, the
/// config named by [`config_label`].
pub fn default_out(options: &TrainOptions, data: &str) -> PathBuf {
    PathBuf::from("runs").join(format!(
        "{}-{}-{}-s{}",
        options.model,
        data,
        config_label(&options.config_name),
        options.seed
    ))
}

/// A config's name as a piece of a directory name: a preset as it is (`posit16`), a format
/// string in its canonical spelling with `<`, `>` and `,` replaced by `_` (`posit<16,1>`
/// gives `posit_16_1`), a file by its stem (`configs/mixed.toml` gives `mixed`).
pub fn config_label(config_name: &str) -> String {
    if crate::nn::config::presets()
        .iter()
        .any(|(name, _)| *name == config_name)
    {
        return config_name.to_string();
    }
    if let Ok(format) = config_name.parse::<crate::Format>() {
        let spelling = format.to_string().replace(['<', '>', ','], "_");
        return spelling.trim_end_matches('_').to_string();
    }
    Path::new(config_name)
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("config")
        .to_string()
}
