//! Which device tensors live on: the CPU or one CUDA GPU, named as on the command line.
//!
//! A [`DeviceSpec`] is the user's choice, spelled `cpu`, `cuda` (the first GPU, `cuda:0`) or
//! `cuda:N`; [`DeviceSpec::open`] turns it into a candle [`Device`]. It is kept apart from
//! the opened device so that a run can record, compare and print its device without a GPU
//! at hand, and so that a wrong spelling, a binary built without CUDA and a missing GPU are
//! three clear errors instead of candle's generic ones.
//!
//! The device changes a run's results in the last bits (candle's CUDA convolution and
//! matrix product sum in another order than the CPU's), so the device's [kind](DeviceSpec::kind)
//! is part of a training run's identity; which GPU of a machine is not.

use std::fmt;
use std::str::FromStr;

use candle_core::Device;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The spellings a device may take, for error messages.
const SPELLINGS: &str = "cpu, cuda (the first GPU, cuda:0) or cuda:N (GPU number N, from 0)";

/// A device by name: the CPU or a CUDA GPU by its number.
///
/// Written and read as its canonical spelling (`cpu`, `cuda:0`, `cuda:1`, ...), also in
/// serialized records.
///
/// ```
/// use qcandle::device::DeviceSpec;
/// let d: DeviceSpec = "cuda".parse()?;
/// assert_eq!(d, DeviceSpec::Cuda(0));
/// assert_eq!(d.to_string(), "cuda:0");
/// assert_eq!(d.kind(), "cuda");
/// assert!("gpu".parse::<DeviceSpec>().is_err());
/// # Ok::<(), qcandle::device::DeviceError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum DeviceSpec {
    /// The CPU.
    #[default]
    Cpu,
    /// CUDA GPU number `N` (`cuda:N`).
    Cuda(usize),
}

/// Why a device name cannot be read or its device cannot be opened.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DeviceError {
    /// The name is none of the spellings.
    #[error("unknown device `{0}`; a device is {SPELLINGS}")]
    Unknown(String),
    /// A CUDA device was asked of a binary built without the `cuda` feature.
    #[error(
        "{0}: this qcandle was built without CUDA support; rebuild with `--features cuda` \
         (see README)"
    )]
    NoCudaSupport(DeviceSpec),
    /// The device does not exist on this machine or cannot be used.
    #[error("cannot open {device}: {reason}")]
    Unavailable {
        /// The device asked for.
        device: DeviceSpec,
        /// candle's (the CUDA driver's) reason.
        reason: String,
    },
}

impl From<DeviceError> for candle_core::Error {
    fn from(e: DeviceError) -> Self {
        candle_core::Error::Msg(e.to_string())
    }
}

impl DeviceSpec {
    /// The device's kind, `cpu` or `cuda`: what changes arithmetic (every GPU of a kind
    /// computes alike).
    pub fn kind(&self) -> &'static str {
        match self {
            DeviceSpec::Cpu => "cpu",
            DeviceSpec::Cuda(_) => "cuda",
        }
    }

    /// The candle device: the CPU, or the CUDA GPU if this binary has CUDA support and
    /// the machine has that GPU. Each call to a CUDA spec opens a new candle device, and
    /// candle treats tensors of two opened devices as on different devices: open once and
    /// share the result.
    pub fn open(&self) -> Result<Device, DeviceError> {
        match *self {
            DeviceSpec::Cpu => Ok(Device::Cpu),
            DeviceSpec::Cuda(ordinal) => open_cuda(*self, ordinal),
        }
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(spec: DeviceSpec, ordinal: usize) -> Result<Device, DeviceError> {
    Device::new_cuda(ordinal).map_err(|e| DeviceError::Unavailable {
        device: spec,
        reason: e.to_string(),
    })
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(spec: DeviceSpec, _ordinal: usize) -> Result<Device, DeviceError> {
    Err(DeviceError::NoCudaSupport(spec))
}

impl FromStr for DeviceSpec {
    type Err = DeviceError;

    fn from_str(s: &str) -> Result<Self, DeviceError> {
        let unknown = || DeviceError::Unknown(s.to_string());
        match s {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            _ => {
                let number = s.strip_prefix("cuda:").ok_or_else(unknown)?;
                // Digits only: `usize`'s parser would also take a sign (`cuda:+1`).
                if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(unknown());
                }
                number.parse().map(DeviceSpec::Cuda).map_err(|_| unknown())
            }
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl From<DeviceSpec> for String {
    fn from(d: DeviceSpec) -> String {
        d.to_string()
    }
}

impl TryFrom<String> for DeviceSpec {
    type Error = DeviceError;

    fn try_from(s: String) -> Result<Self, DeviceError> {
        s.parse()
    }
}
