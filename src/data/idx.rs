//! The IDX file format of MNIST and Fashion-MNIST, gzip-compressed or not.
//!
//! An IDX file is a big-endian header followed by the raw items: a 32-bit magic number
//! whose low byte is the number of dimensions and whose third byte is the element type
//! (`0x08`, unsigned byte, for both datasets), one 32-bit size per dimension, then the
//! elements in row-major order. Images are magic `0x00000803` with dimensions
//! `(count, 28, 28)`; labels are magic `0x00000801` with dimension `(count)`.
//!
//! Every check here reports what it found against what it expected, naming the file, so a
//! bad download is diagnosed from the message alone.

use std::fmt;
use std::io::Read;
use std::path::Path;

use flate2::read::GzDecoder;

use super::DataError;

/// Magic number of an IDX file of unsigned-byte images with three dimensions.
pub const IMAGES_MAGIC: u32 = 0x0000_0803;
/// Magic number of an IDX file of unsigned-byte labels with one dimension.
pub const LABELS_MAGIC: u32 = 0x0000_0801;
/// Image side in pixels: both datasets have 28x28 images.
pub const SIDE: usize = 28;
/// Number of classes: labels are in `0..CLASSES`.
pub const CLASSES: u8 = 10;

/// What is wrong with a corrupt file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Corruption {
    /// The gzip stream could not be decompressed (bad header, bad data, cut short).
    BadGzip(String),
    /// The magic number is not the one this file should have.
    WrongMagic {
        /// The magic number that was read.
        found: u32,
        /// The magic number that was expected.
        expected: u32,
    },
    /// The file ends before its header or its items do.
    Truncated {
        /// Bytes the header says the file has.
        expected: u64,
        /// Bytes it has.
        found: u64,
    },
    /// The file has bytes after its last item.
    TrailingBytes {
        /// How many bytes follow the last item.
        extra: u64,
    },
    /// Images that are not 28x28.
    BadDims {
        /// The image dimensions the header gives (rows, columns).
        rows: u32,
        /// Columns.
        cols: u32,
    },
    /// A label outside `0..10`.
    LabelOutOfRange {
        /// The position of the label in the file.
        index: usize,
        /// Its value.
        label: u8,
    },
    /// The images file and the labels file hold different numbers of items.
    CountMismatch {
        /// Number of images.
        images: usize,
        /// Number of labels.
        labels: usize,
        /// The labels file.
        labels_origin: String,
    },
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Corruption::BadGzip(e) => write!(f, "not a valid gzip file ({e})"),
            Corruption::WrongMagic { found, expected } => write!(
                f,
                "wrong magic number {found:#010x} (expected {expected:#010x}: {})",
                if *expected == IMAGES_MAGIC {
                    "IDX images"
                } else {
                    "IDX labels"
                }
            ),
            Corruption::Truncated { expected, found } => write!(
                f,
                "truncated: {found} bytes (decompressed), the header implies {expected}"
            ),
            Corruption::TrailingBytes { extra } => {
                write!(f, "{extra} unexpected bytes after the last item")
            }
            Corruption::BadDims { rows, cols } => {
                write!(f, "images are {rows}x{cols}, expected {SIDE}x{SIDE}")
            }
            Corruption::LabelOutOfRange { index, label } => write!(
                f,
                "label {label} at index {index} is out of range (expected 0..{CLASSES})"
            ),
            Corruption::CountMismatch {
                images,
                labels,
                labels_origin,
            } => write!(
                f,
                "{images} images but {labels} labels in {labels_origin} (the counts must match)"
            ),
        }
    }
}

fn corrupt(origin: &str, what: Corruption) -> DataError {
    DataError::Corrupt {
        path: origin.to_string(),
        what,
    }
}

/// Decompresses gzip bytes; `origin` names them in errors.
pub fn gunzip(bytes: &[u8], origin: &str) -> Result<Vec<u8>, DataError> {
    let mut out = Vec::with_capacity(bytes.len() * 2);
    GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .map_err(|e| corrupt(origin, Corruption::BadGzip(e.to_string())))?;
    Ok(out)
}

/// Reads a file's IDX bytes: decompressed if its name ends in `.gz`, as they are otherwise.
pub fn read_file(path: &Path) -> Result<Vec<u8>, DataError> {
    let bytes = std::fs::read(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if path.extension().is_some_and(|e| e == "gz") {
        gunzip(&bytes, &path.display().to_string())
    } else {
        Ok(bytes)
    }
}

fn be_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// Checks the magic number and length of IDX bytes, returning the dimensions and the items.
fn parse<'a>(bytes: &'a [u8], magic: u32, origin: &str) -> Result<(Vec<u32>, &'a [u8]), DataError> {
    let short = |expected: usize| {
        corrupt(
            origin,
            Corruption::Truncated {
                expected: expected as u64,
                found: bytes.len() as u64,
            },
        )
    };
    if bytes.len() < 4 {
        return Err(short(4));
    }
    let found = be_u32(bytes, 0);
    if found != magic {
        return Err(corrupt(
            origin,
            Corruption::WrongMagic {
                found,
                expected: magic,
            },
        ));
    }
    let ndim = (magic & 0xff) as usize;
    let header = 4 + 4 * ndim;
    if bytes.len() < header {
        return Err(short(header));
    }
    let dims: Vec<u32> = (0..ndim).map(|d| be_u32(bytes, 4 + 4 * d)).collect();
    let items: u64 = dims.iter().map(|&d| d as u64).product();
    let expected = header as u64 + items;
    let found = bytes.len() as u64;
    if found < expected {
        return Err(corrupt(origin, Corruption::Truncated { expected, found }));
    }
    if found > expected {
        return Err(corrupt(
            origin,
            Corruption::TrailingBytes {
                extra: found - expected,
            },
        ));
    }
    Ok((dims, &bytes[header..]))
}

/// Parses decompressed IDX image bytes: the number of images and their pixels, row-major,
/// 784 per image. Checks the magic number, that images are 28x28 and the length.
pub fn parse_images<'a>(bytes: &'a [u8], origin: &str) -> Result<(usize, &'a [u8]), DataError> {
    if bytes.len() >= 16 && be_u32(bytes, 0) == IMAGES_MAGIC {
        let (rows, cols) = (be_u32(bytes, 8), be_u32(bytes, 12));
        if rows as usize != SIDE || cols as usize != SIDE {
            return Err(corrupt(origin, Corruption::BadDims { rows, cols }));
        }
    }
    let (dims, pixels) = parse(bytes, IMAGES_MAGIC, origin)?;
    Ok((dims[0] as usize, pixels))
}

/// Parses decompressed IDX label bytes. Checks the magic number, the length and that every
/// label is in `0..10`.
pub fn parse_labels<'a>(bytes: &'a [u8], origin: &str) -> Result<&'a [u8], DataError> {
    let (_, labels) = parse(bytes, LABELS_MAGIC, origin)?;
    if let Some((index, &label)) = labels.iter().enumerate().find(|(_, &l)| l >= CLASSES) {
        return Err(corrupt(
            origin,
            Corruption::LabelOutOfRange { index, label },
        ));
    }
    Ok(labels)
}

/// Checks that an images file and a labels file hold the same number of items.
pub fn check_counts(
    images: usize,
    images_origin: &str,
    labels: usize,
    labels_origin: &str,
) -> Result<(), DataError> {
    if images == labels {
        Ok(())
    } else {
        Err(corrupt(
            images_origin,
            Corruption::CountMismatch {
                images,
                labels,
                labels_origin: labels_origin.to_string(),
            },
        ))
    }
}
