//! The library leaves the process environment as the program that links it set it: its
//! convolution, pooling and trainer do not set candle's or rayon's thread variables (the
//! `qcandle` tool sets them itself at start-up).
//!
//! One test in this file, so no other test thread reads the environment while it changes.

use candle_core::{DType, Device, Tensor};
use candle_nn::Conv2dConfig;

/// The variables the tool's CPU thread settings write.
const THREAD_VARIABLES: [&str; 2] = ["RAYON_NUM_THREADS", "CANDLE_BARRIER_POOL_SPIN_LIMIT"];

/// The thread variables present in the environment.
fn thread_variables_set() -> Vec<&'static str> {
    THREAD_VARIABLES
        .into_iter()
        .filter(|name| std::env::var_os(name).is_some())
        .collect()
}

/// A LeNet-5 trainer is built (its model and optimizer), as a program using the library
/// would before its first step.
#[cfg(feature = "cli")]
fn build_a_trainer() -> anyhow::Result<()> {
    use qcandle::nn::QConfig;
    use qcandle::train::{OptimizerKind, TrainOptions, Trainer};
    let options = TrainOptions {
        model: "lenet5".into(),
        config_name: "posit16".into(),
        epochs: 1,
        batch: 8,
        lr: 1e-3,
        optimizer: OptimizerKind::Adam,
        seed: 0,
        train_limit: None,
        device: qcandle::device::DeviceSpec::Cpu,
        schedule: Default::default(),
        weight_decay: None,
        beta2: None,
    };
    Trainer::new(options, QConfig::preset("posit16")?)?;
    Ok(())
}

#[test]
fn convolution_pooling_and_training_leave_the_thread_variables_unset() -> anyhow::Result<()> {
    for name in THREAD_VARIABLES {
        std::env::remove_var(name);
    }
    let x = Tensor::ones((2, 1, 8, 8), DType::F32, &Device::Cpu)?;
    let w = Tensor::ones((3, 1, 3, 3), DType::F32, &Device::Cpu)?;
    let y = qcandle::ops::conv2d(&x, &w, None, &Conv2dConfig::default())?;
    let pooled = qcandle::ops::max_pool2d(&y, 2, 2)?;
    assert_eq!(pooled.dims(), [2, 3, 3, 3]);
    #[cfg(feature = "cli")]
    build_a_trainer()?;
    assert_eq!(
        thread_variables_set(),
        Vec::<&str>::new(),
        "the library set these variables"
    );
    Ok(())
}
