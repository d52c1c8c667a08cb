//! Datasets: MNIST and Fashion-MNIST from their IDX files, and an embedded subset.
//!
//! [`load`] reads the four standard files (`train-images-idx3-ubyte.gz`,
//! `train-labels-idx1-ubyte.gz`, `t10k-images-idx3-ubyte.gz`, `t10k-labels-idx1-ubyte.gz`,
//! or the same names without `.gz`) from a directory; [`embedded`] gives the first 6000
//! training and 1000 test items of Fashion-MNIST, compiled into the library, so examples
//! and tests run without any download. [`DataSource`] is the choice between the two as the
//! command line spells it (`fashion-mnist`, `mnist` or `embedded`, or `modadd`, the
//! synthetic sequence task of [`modadd`], generated in memory).
//!
//! A data directory that is missing or is a file, a missing file, and a corrupt file (see
//! [`idx`] for the checks, made as the file is read, so a file declaring or inflating to
//! gigabytes is refused without being read whole) are errors naming the path.
//!
//! Images come as `(N, 1, 28, 28)` f32 tensors scaled to `[-1, 1]` by `x / 127.5 - 1`
//! (pixel 0 becomes -1, 255 becomes exactly 1), labels as `(N)` u32 tensors, both on the
//! CPU. [`Dataset::train_batches`] shuffles reproducibly: the order is a Fisher–Yates
//! permutation drawn from the [`Philox`](crate::philox) stream keyed by (seed, epoch), so
//! a run is repeated exactly from its seed.
//!
//! candle-datasets has an MNIST loader, but it reads only uncompressed files and depends on
//! hf-hub; this one reads the `.gz` files as distributed and needs no network.

pub mod idx;
pub mod modadd;

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use candle_core::{Device, Tensor};
use thiserror::Error;

pub use idx::Corruption;

use crate::philox::Stream;

/// Environment variable naming the data directory when none is given explicitly.
pub const DATA_ENV: &str = "QCANDLE_DATA";

/// Where the Debian package `dataset-fashion-mnist` installs Fashion-MNIST.
pub const FASHION_MNIST_DEFAULT_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// The four files of a dataset directory, in the order train images, train labels, test
/// images, test labels. Each may also be present uncompressed (without `.gz`).
pub const FILES: [&str; 4] = [
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
];

/// The datasets [`load`] knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DatasetName {
    /// Fashion-MNIST (Zalando): 28x28 grayscale clothing images, 10 classes.
    FashionMnist,
    /// MNIST: 28x28 grayscale handwritten digits, 10 classes.
    Mnist,
    /// Modular addition (see [`modadd`]), generated, not read from files.
    ModAdd,
}

impl DatasetName {
    /// Every dataset read from files, in the order they are listed in messages.
    pub const ALL: [DatasetName; 2] = [DatasetName::FashionMnist, DatasetName::Mnist];

    /// The name as written on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            DatasetName::FashionMnist => "fashion-mnist",
            DatasetName::Mnist => "mnist",
            DatasetName::ModAdd => "modadd",
        }
    }

    /// The directory used when neither an explicit one nor [`DATA_ENV`] is given, if any.
    pub fn default_dir(self) -> Option<&'static Path> {
        match self {
            DatasetName::FashionMnist => Some(Path::new(FASHION_MNIST_DEFAULT_DIR)),
            DatasetName::Mnist | DatasetName::ModAdd => None,
        }
    }

    /// How to obtain the files, for error messages.
    pub fn how_to_get(self) -> String {
        let files = FILES.join(", ");
        match self {
            DatasetName::FashionMnist => format!(
                "install them with `apt-get install dataset-fashion-mnist` (into \
                 {FASHION_MNIST_DEFAULT_DIR}), or pass --data-dir DIR or set {DATA_ENV}=DIR \
                 for a directory holding {files}"
            ),
            DatasetName::Mnist => format!(
                "download the official MNIST files ({files}) and pass --data-dir DIR or set \
                 {DATA_ENV}=DIR to their directory"
            ),
            DatasetName::ModAdd => "it is generated in memory and reads no files".to_string(),
        }
    }
}

impl fmt::Display for DatasetName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DatasetName {
    type Err = DataError;

    fn from_str(s: &str) -> Result<Self, DataError> {
        DatasetName::ALL
            .into_iter()
            .find(|n| n.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| DataError::UnknownName {
                input: s.to_string(),
            })
    }
}

/// Where a dataset comes from, as the command line's `--data` names it: a dataset read
/// from its IDX files, or the embedded Fashion-MNIST subset (`embedded`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataSource {
    /// The files of a dataset, from a data directory (see [`load`]).
    Files(DatasetName),
    /// The subset compiled into the library (see [`embedded`]).
    Embedded,
    /// Modular addition mod 97, generated in memory (see [`modadd`]).
    ModAdd,
}

impl DataSource {
    /// The name of the embedded subset.
    pub const EMBEDDED: &'static str = "embedded";

    /// Every source name, in the order they are listed in messages.
    pub const NAMES: [&'static str; 4] = [
        "fashion-mnist",
        "mnist",
        DataSource::EMBEDDED,
        DataSource::MODADD,
    ];

    /// The name of the modular-addition task.
    pub const MODADD: &'static str = "modadd";

    /// Loads the dataset: [`load`] from `dir` for files, [`embedded`] for the subset (which
    /// reads no directory, so giving one is an error rather than silently ignored).
    pub fn load(self, dir: Option<&Path>) -> Result<Dataset, DataError> {
        match (self, dir) {
            (DataSource::Files(name), dir) => load(name, dir),
            (DataSource::Embedded, None) => embedded(),
            (DataSource::Embedded, Some(dir)) => Err(DataError::DirectoryWithEmbedded {
                dir: dir.to_path_buf(),
            }),
            (DataSource::ModAdd, None) => modadd::modadd(modadd::MODADD_P),
            (DataSource::ModAdd, Some(dir)) => Err(DataError::DirectoryWithGenerated {
                dir: dir.to_path_buf(),
            }),
        }
    }
}

impl fmt::Display for DataSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataSource::Files(name) => name.fmt(f),
            DataSource::Embedded => f.write_str(DataSource::EMBEDDED),
            DataSource::ModAdd => f.write_str(DataSource::MODADD),
        }
    }
}

impl FromStr for DataSource {
    type Err = DataError;

    fn from_str(s: &str) -> Result<Self, DataError> {
        if s.trim().eq_ignore_ascii_case(DataSource::EMBEDDED) {
            return Ok(DataSource::Embedded);
        }
        if s.trim().eq_ignore_ascii_case(DataSource::MODADD) {
            return Ok(DataSource::ModAdd);
        }
        s.parse()
            .map(DataSource::Files)
            .map_err(|_| DataError::UnknownSource {
                input: s.to_string(),
            })
    }
}

/// Why a dataset could not be loaded or batched.
#[derive(Debug, Error)]
pub enum DataError {
    /// A string that names no dataset read from files.
    #[error("unknown dataset {input:?} (known: fashion-mnist, mnist)")]
    UnknownName {
        /// The string that was given.
        input: String,
    },
    /// A string that names no data source: no dataset and not `embedded`.
    #[error("unknown dataset {input:?} (known: {})", DataSource::NAMES.join(", "))]
    UnknownSource {
        /// The string that was given.
        input: String,
    },
    /// No data directory was given and the dataset has no default one.
    #[error("{dataset}: no data directory; {}", dataset.how_to_get())]
    NoDirectory {
        /// The dataset.
        dataset: DatasetName,
    },
    /// The data directory does not exist.
    #[error("{dataset}: data directory {} does not exist; {}", dir.display(), dataset.how_to_get())]
    MissingDirectory {
        /// The dataset.
        dataset: DatasetName,
        /// The directory.
        dir: PathBuf,
    },
    /// The data directory is a file (or something else that is not a directory).
    #[error("{dataset}: data directory {} is a file, not a directory; {}", dir.display(), dataset.how_to_get())]
    NotADirectory {
        /// The dataset.
        dataset: DatasetName,
        /// The path given as the directory.
        dir: PathBuf,
    },
    /// A data directory given with the embedded subset, which reads no files.
    #[error("the embedded subset reads no files; a data directory ({}) cannot be used with it", dir.display())]
    DirectoryWithEmbedded {
        /// The directory that was given.
        dir: PathBuf,
    },
    /// A data directory given with a generated dataset (`modadd`), which reads no files.
    #[error("modadd is generated in memory and reads no files; a data directory ({}) cannot be used with it", dir.display())]
    DirectoryWithGenerated {
        /// The directory that was given.
        dir: PathBuf,
    },
    /// A file of the dataset is absent, compressed and uncompressed.
    #[error(
        "{dataset}: expected {} (or it uncompressed, without .gz) but it does not exist; {}",
        path.display(), dataset.how_to_get()
    )]
    MissingFile {
        /// The dataset.
        dataset: DatasetName,
        /// The expected `.gz` path.
        path: PathBuf,
    },
    /// A file that exists but cannot be read.
    #[error("{}: cannot read: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A file whose content is not a valid IDX file of the dataset.
    #[error("{path}: corrupt dataset file: {what}")]
    Corrupt {
        /// The file (`embedded:<name>` for the embedded subset).
        path: String,
        /// What is wrong.
        what: Corruption,
    },
    /// A batch size of zero.
    #[error("batch size must be at least 1")]
    ZeroBatch,
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] candle_core::Error),
}

impl From<DataError> for candle_core::Error {
    fn from(e: DataError) -> Self {
        match e {
            DataError::Tensor(e) => e,
            e => candle_core::Error::Msg(e.to_string()),
        }
    }
}

/// A dataset in memory: images `(N, 1, 28, 28)` f32 in `[-1, 1]` (`x / 127.5 - 1`: pixel 0
/// is -1, 255 is 1) and labels `(N)` u32 in `0..10`, on the CPU; for [`modadd`], token rows
/// `(N, 1, 1, 3)` and labels in `0..97`.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Which dataset.
    pub name: DatasetName,
    /// Training images, `(N, 1, 28, 28)` f32.
    pub train_images: Tensor,
    /// Training labels, `(N)` u32.
    pub train_labels: Tensor,
    /// Test images, `(M, 1, 28, 28)` f32.
    pub test_images: Tensor,
    /// Test labels, `(M)` u32.
    pub test_labels: Tensor,
    /// Where it came from: the directory, or `embedded`.
    pub source: String,
}

/// The directory [`load`] reads: `explicit` if given, else the value of [`DATA_ENV`] (passed
/// as `env` so callers and tests control it), else the dataset's default directory.
pub fn resolve_dir(
    name: DatasetName,
    explicit: Option<&Path>,
    env: Option<OsString>,
) -> Result<PathBuf, DataError> {
    if let Some(dir) = explicit {
        return Ok(dir.to_path_buf());
    }
    if let Some(dir) = env.filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    name.default_dir()
        .map(Path::to_path_buf)
        .ok_or(DataError::NoDirectory { dataset: name })
}

/// Loads a dataset from `dir`, else from the directory in `QCANDLE_DATA`, else from its
/// default directory (Fashion-MNIST: [`FASHION_MNIST_DEFAULT_DIR`]; MNIST has none).
///
/// Each of the [`FILES`] is read compressed, or uncompressed (name without `.gz`) when the
/// `.gz` is absent. Errors name the file and say how to obtain the dataset.
///
/// [`DatasetName::ModAdd`] reads no files: it is generated ([`modadd::modadd`]) and `dir` is
/// not used.
pub fn load(name: DatasetName, dir: Option<&Path>) -> Result<Dataset, DataError> {
    if name == DatasetName::ModAdd {
        return modadd::modadd(modadd::MODADD_P);
    }
    let dir = resolve_dir(name, dir, std::env::var_os(DATA_ENV))?;
    check_dir(name, &dir)?;
    let path_of = |file: &str| -> Result<PathBuf, DataError> {
        let gz = dir.join(file);
        if gz.exists() {
            return Ok(gz);
        }
        let raw = gz.with_extension("");
        if raw.exists() {
            return Ok(raw);
        }
        Err(DataError::MissingFile {
            dataset: name,
            path: gz,
        })
    };
    let paths = FILES
        .iter()
        .map(|f| path_of(f))
        .collect::<Result<Vec<_>, _>>()?;
    let split = |images: &Path, labels: &Path| -> Result<(Tensor, Tensor), DataError> {
        let (image_items, label_items) = rayon::join(
            || idx::read_file(images, idx::Kind::Images),
            || idx::read_file(labels, idx::Kind::Labels),
        );
        decode_split(
            &image_items?,
            &images.display().to_string(),
            &label_items?,
            &labels.display().to_string(),
        )
    };
    let (train, test) = rayon::join(
        || split(&paths[0], &paths[1]),
        || split(&paths[2], &paths[3]),
    );
    let ((train_images, train_labels), (test_images, test_labels)) = (train?, test?);
    Ok(Dataset {
        name,
        train_images,
        train_labels,
        test_images,
        test_labels,
        source: dir.display().to_string(),
    })
}

/// Checks that the data directory `dir` of dataset `name` exists and is a directory.
fn check_dir(name: DatasetName, dir: &Path) -> Result<(), DataError> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(DataError::NotADirectory {
            dataset: name,
            dir: dir.to_path_buf(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(DataError::MissingDirectory {
            dataset: name,
            dir: dir.to_path_buf(),
        }),
        Err(source) => Err(DataError::Io {
            path: dir.to_path_buf(),
            source,
        }),
    }
}

/// The embedded Fashion-MNIST subset, gzip-compressed IDX files made by
/// `scripts/make_subset.py` (see `data/README.md`).
const EMBEDDED: [(&str, &[u8]); 4] = [
    (
        FILES[0],
        include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/data/train-images-idx3-ubyte.gz"
        )),
    ),
    (
        FILES[1],
        include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/data/train-labels-idx1-ubyte.gz"
        )),
    ),
    (
        FILES[2],
        include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/data/t10k-images-idx3-ubyte.gz"
        )),
    ),
    (
        FILES[3],
        include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/data/t10k-labels-idx1-ubyte.gz"
        )),
    ),
];

/// Number of training items in the [`embedded`] subset.
pub const EMBEDDED_TRAIN: usize = 6000;
/// Number of test items in the [`embedded`] subset.
pub const EMBEDDED_TEST: usize = 1000;

/// The Fashion-MNIST subset compiled into the library: the first 6000 training and the
/// first 1000 test items, in order. Its `source` is `embedded`.
pub fn embedded() -> Result<Dataset, DataError> {
    let split = |i: usize| -> Result<(Tensor, Tensor), DataError> {
        let (images, labels) = (EMBEDDED[i], EMBEDDED[i + 1]);
        let origin = |f: &str| format!("embedded:{f}");
        let decode = |(name, bytes): (&str, &[u8]), kind| {
            idx::decode(bytes, true, kind, idx::MAX_ITEMS, &origin(name))
        };
        decode_split(
            &decode(images, idx::Kind::Images)?,
            &origin(images.0),
            &decode(labels, idx::Kind::Labels)?,
            &origin(labels.0),
        )
    };
    let (train, test) = rayon::join(|| split(0), || split(2));
    let ((train_images, train_labels), (test_images, test_labels)) = (train?, test?);
    Ok(Dataset {
        name: DatasetName::FashionMnist,
        train_images,
        train_labels,
        test_images,
        test_labels,
        source: "embedded".to_string(),
    })
}

/// Turns one split's checked IDX items into `(N, 1, 28, 28)` f32 images in `[-1, 1]` and
/// `(N)` u32 labels, after checking that the two files hold as many items.
fn decode_split(
    images: &idx::Items,
    images_origin: &str,
    labels: &idx::Items,
    labels_origin: &str,
) -> Result<(Tensor, Tensor), DataError> {
    let n = images.count;
    idx::check_counts(n, images_origin, labels.count, labels_origin)?;
    let scale: [f32; 256] = std::array::from_fn(|x| x as f32 / 127.5 - 1.0);
    let pixels: Vec<f32> = images.bytes.iter().map(|&p| scale[p as usize]).collect();
    let images = Tensor::from_vec(pixels, (n, 1, idx::SIDE, idx::SIDE), &Device::Cpu)?;
    let labels: Vec<u32> = labels.bytes.iter().map(|&l| l as u32).collect();
    let labels = Tensor::from_vec(labels, n, &Device::Cpu)?;
    Ok((images, labels))
}

/// The training order of an epoch: a permutation of `0..n`, a function of `(n, seed, epoch)`
/// only.
///
/// Fisher–Yates, swapping position `i` (from `n - 1` down to 1) with a position drawn
/// uniformly from `0..=i`. The draws are unbiased (Lemire's multiply-and-reject on 32-bit
/// words) and read the Philox stream keyed by `seed ^ SHUFFLE_KEY` with call `epoch`, so they
/// are independent of the stochastic-rounding stream of the same seed.
pub fn permutation(n: usize, seed: u64, epoch: usize) -> Vec<u32> {
    let mut order: Vec<u32> = (0..n as u32).collect();
    let mut words = Words::new(Stream::new(seed ^ SHUFFLE_KEY, epoch as u64));
    for i in (1..n).rev() {
        let j = words.below(i as u32 + 1) as usize;
        order.swap(i, j);
    }
    order
}

/// Mixed into the shuffle's seed to separate its stream from stochastic rounding's.
const SHUFFLE_KEY: u64 = 0x5348_5546_464c_4531; // "SHUFFLE1"

/// 32-bit words read in order from a Philox stream.
struct Words {
    stream: Stream,
    next: u64,
    buf: [u32; 4],
    used: usize,
}

impl Words {
    fn new(stream: Stream) -> Self {
        Words {
            stream,
            next: 0,
            buf: [0; 4],
            used: 4,
        }
    }

    fn word(&mut self) -> u32 {
        if self.used == 4 {
            self.buf = self.stream.block(self.next);
            self.next += 1;
            self.used = 0;
        }
        self.used += 1;
        self.buf[self.used - 1]
    }

    /// A uniform draw from `0..bound` (`bound >= 1`), by Lemire's method: the high word of
    /// `word * bound`, rejecting the `2^32 mod bound` low products that would bias it.
    fn below(&mut self, bound: u32) -> u32 {
        let threshold = bound.wrapping_neg() % bound;
        loop {
            let m = self.word() as u64 * bound as u64;
            if (m as u32) >= threshold {
                return (m >> 32) as u32;
            }
        }
    }
}

impl Dataset {
    /// Number of training items.
    pub fn train_len(&self) -> usize {
        self.train_labels.dims().first().copied().unwrap_or(0)
    }

    /// Number of test items.
    pub fn test_len(&self) -> usize {
        self.test_labels.dims().first().copied().unwrap_or(0)
    }

    /// The first `train` training and the first `test` test items (at most all of them),
    /// for quick runs. Shares storage with `self`.
    pub fn subset(&self, train: usize, test: usize) -> Result<Dataset, DataError> {
        let (train, test) = (train.min(self.train_len()), test.min(self.test_len()));
        Ok(Dataset {
            name: self.name,
            train_images: self.train_images.narrow(0, 0, train)?,
            train_labels: self.train_labels.narrow(0, 0, train)?,
            test_images: self.test_images.narrow(0, 0, test)?,
            test_labels: self.test_labels.narrow(0, 0, test)?,
            source: self.source.clone(),
        })
    }

    /// The dataset with its tensors on `device`.
    pub fn to_device(&self, device: &Device) -> Result<Dataset, DataError> {
        Ok(Dataset {
            name: self.name,
            train_images: self.train_images.to_device(device)?,
            train_labels: self.train_labels.to_device(device)?,
            test_images: self.test_images.to_device(device)?,
            test_labels: self.test_labels.to_device(device)?,
            source: self.source.clone(),
        })
    }

    /// The training set of epoch `epoch` in batches of `batch` (the last one smaller when
    /// `batch` does not divide the size), in the order of [`permutation`]`(n, seed, epoch)`:
    /// the same for the same (seed, epoch), different across epochs. Each batch is gathered
    /// with `index_select` when the iterator reaches it.
    pub fn train_batches(
        &self,
        batch: usize,
        epoch: usize,
        seed: u64,
    ) -> Result<Batches, DataError> {
        let order = permutation(self.train_len(), seed, epoch);
        Batches::new(&self.train_images, &self.train_labels, batch, Some(order))
    }

    /// The test set in batches of `batch`, in order (the last one smaller when `batch` does
    /// not divide the size).
    pub fn test_batches(&self, batch: usize) -> Result<Batches, DataError> {
        Batches::new(&self.test_images, &self.test_labels, batch, None)
    }
}

/// An iterator over `(images, labels)` batches of a dataset split; see
/// [`Dataset::train_batches`] and [`Dataset::test_batches`].
#[derive(Debug, Clone)]
pub struct Batches {
    images: Tensor,
    labels: Tensor,
    batch: usize,
    /// The item order, or `None` for the stored order.
    order: Option<Vec<u32>>,
    start: usize,
    len: usize,
}

impl Batches {
    fn new(
        images: &Tensor,
        labels: &Tensor,
        batch: usize,
        order: Option<Vec<u32>>,
    ) -> Result<Self, DataError> {
        if batch == 0 {
            return Err(DataError::ZeroBatch);
        }
        Ok(Batches {
            images: images.clone(),
            labels: labels.clone(),
            batch,
            len: labels.dims().first().copied().unwrap_or(0),
            order,
            start: 0,
        })
    }

    fn gather(&self, start: usize, size: usize) -> Result<(Tensor, Tensor), DataError> {
        Ok(match &self.order {
            Some(order) => {
                let ids = Tensor::from_slice(&order[start..start + size], size, &Device::Cpu)?
                    .to_device(self.images.device())?;
                (
                    self.images.index_select(&ids, 0)?,
                    self.labels.index_select(&ids, 0)?,
                )
            }
            None => (
                self.images.narrow(0, start, size)?,
                self.labels.narrow(0, start, size)?,
            ),
        })
    }
}

impl Iterator for Batches {
    type Item = Result<(Tensor, Tensor), DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.start >= self.len {
            return None;
        }
        let size = self.batch.min(self.len - self.start);
        let item = self.gather(self.start, size);
        self.start += size;
        Some(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = (self.len - self.start).div_ceil(self.batch);
        (left, Some(left))
    }
}

impl ExactSizeIterator for Batches {}
