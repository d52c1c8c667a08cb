//! The IDX file format of MNIST and Fashion-MNIST, gzip-compressed or not.
//!
//! An IDX file is a big-endian header followed by the raw items: a 32-bit magic number
//! whose low byte is the number of dimensions and whose third byte is the element type
//! (`0x08`, unsigned byte, for both datasets), one 32-bit size per dimension, then the
//! elements in row-major order. Images are magic `0x00000803` with dimensions
//! `(count, 28, 28)`; labels are magic `0x00000801` with dimension `(count)`.
//!
//! Files are read as a stream, header first: the magic number, the image size (28x28) and
//! the item count (at most [`MAX_ITEMS`]) are checked before anything is allocated for the
//! items, then exactly the declared bytes are read, the buffer growing only as data
//! actually arrives, and the file must end there. So a small file that declares, or
//! decompresses to, gigabytes is refused after reading a header and at most the bytes it
//! is allowed to hold, never read whole. An uncompressed file's declared size is checked
//! against its length before its items are read.
//!
//! Every check here reports what it found against what it expected, naming the file, so a
//! bad download is diagnosed from the message alone.

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;

use super::DataError;

/// Magic number of an IDX file of unsigned-byte images with three dimensions.
pub const IMAGES_MAGIC: u32 = 0x0000_0803;
/// Magic number of an IDX file of unsigned-byte labels with one dimension.
pub const LABELS_MAGIC: u32 = 0x0000_0801;
/// Image side in pixels: both datasets have 28x28 images.
pub const SIDE: usize = 28;
/// Number of classes: labels are in `0..CLASSES`.
pub const CLASSES: u8 = 10;
/// The most items a file may declare: 2^18 = 262,144, above every 28x28 IDX dataset of
/// this kind (MNIST and Fashion-MNIST have 60,000 training and 10,000 test items; the
/// largest EMNIST split read this way, digits, 240,000). An images file at the limit holds
/// 205 MB of pixels; a header declaring more is corrupt and refused before any allocation.
pub const MAX_ITEMS: u32 = 1 << 18;

/// Trailing bytes counted after the last item before giving up counting (a file that
/// decompresses to gigabytes of extra data is not decompressed to the end to say so).
const TRAILING_COUNT_LIMIT: u64 = 1 << 20;

/// The read size of the item loop, and the first capacity of the item buffer.
const READ_CHUNK: usize = 1 << 16;

/// Which of the two files of a dataset split an IDX file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Images: magic `0x00000803`, dimensions `(count, 28, 28)`.
    Images,
    /// Labels: magic `0x00000801`, dimension `(count)`, each in `0..10`.
    Labels,
}

impl Kind {
    /// The magic number of this kind of file.
    pub fn magic(self) -> u32 {
        match self {
            Kind::Images => IMAGES_MAGIC,
            Kind::Labels => LABELS_MAGIC,
        }
    }

    /// Bytes per item: 784 per image, 1 per label.
    pub fn item_bytes(self) -> u64 {
        match self {
            Kind::Images => (SIDE * SIDE) as u64,
            Kind::Labels => 1,
        }
    }

    /// Header bytes: the magic number and one 32-bit size per dimension.
    fn header_bytes(self) -> usize {
        4 + 4 * (self.magic() & 0xff) as usize
    }
}

/// How an IDX file's bytes are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// gzip-compressed (a file of several gzip members is read as their concatenation, as
    /// `gunzip` reads it; anything else after the last member is an error).
    Gzip,
    /// Uncompressed, with this total length in bytes.
    Raw {
        /// The file's length.
        len: u64,
    },
}

/// The items of a checked IDX file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Items {
    /// The number of items.
    pub count: usize,
    /// The items, row-major: `count * 784` pixels or `count` labels (each in `0..10`).
    pub bytes: Vec<u8>,
}

/// What is wrong with a corrupt file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Corruption {
    /// The gzip stream could not be decompressed (bad header, bad data, cut short, or
    /// bytes after the last gzip member).
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
        /// How many bytes follow the last item (a lower bound when `exact` is false).
        extra: u64,
        /// Whether `extra` is the exact count; counting stops after 1 MiB.
        exact: bool,
    },
    /// Images that are not 28x28.
    BadDims {
        /// The image dimensions the header gives (rows, columns).
        rows: u32,
        /// Columns.
        cols: u32,
    },
    /// A header declaring more items than [`MAX_ITEMS`] (or the limit the reader was given).
    TooManyItems {
        /// The count the header declares.
        count: u32,
        /// The most the reader accepts.
        max: u32,
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
            Corruption::TrailingBytes { extra, exact: true } => {
                write!(f, "{extra} unexpected bytes after the last item")
            }
            Corruption::TrailingBytes {
                extra,
                exact: false,
            } => {
                write!(f, "at least {extra} unexpected bytes after the last item")
            }
            Corruption::BadDims { rows, cols } => {
                write!(f, "images are {rows}x{cols}, expected {SIDE}x{SIDE}")
            }
            Corruption::TooManyItems { count, max } => write!(
                f,
                "the header declares {count} items, more than the {max} a dataset file may hold"
            ),
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

/// Reads a dataset file: gzip-compressed if its name ends in `.gz`, uncompressed
/// otherwise. See [`read`] for the checks.
pub fn read_file(path: &Path, kind: Kind) -> Result<Items, DataError> {
    let io_error = |source| DataError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io_error)?;
    let meta = file.metadata().map_err(io_error)?;
    if meta.is_dir() {
        return Err(io_error(io::Error::new(
            io::ErrorKind::IsADirectory,
            "it is a directory, not a file",
        )));
    }
    let origin = path.display().to_string();
    if path.extension().is_some_and(|e| e == "gz") {
        read(
            MultiGzDecoder::new(file),
            Encoding::Gzip,
            kind,
            MAX_ITEMS,
            &origin,
        )
    } else {
        let len = meta.len();
        read(file, Encoding::Raw { len }, kind, MAX_ITEMS, &origin)
    }
}

/// Reads IDX bytes held in memory (gzip-compressed when `compressed`), allowing at most
/// `max_items` items. See [`read`] for the checks.
pub fn decode(
    bytes: &[u8],
    compressed: bool,
    kind: Kind,
    max_items: u32,
    origin: &str,
) -> Result<Items, DataError> {
    if compressed {
        read(
            MultiGzDecoder::new(bytes),
            Encoding::Gzip,
            kind,
            max_items,
            origin,
        )
    } else {
        let len = bytes.len() as u64;
        read(bytes, Encoding::Raw { len }, kind, max_items, origin)
    }
}

/// Reads an IDX file of `kind` from `stream` (the decompressed bytes for
/// [`Encoding::Gzip`]); `origin` names it in errors.
///
/// Checks, in order: the magic number; for images, that they are 28x28; that the count is
/// at most `max_items`; for an uncompressed file, that its length is the header's size;
/// then reads the items, growing the buffer as they arrive (never beyond the declared
/// size, nor beyond twice the bytes read), and checks that the stream ends exactly after
/// them and, for labels, that each is in `0..10`.
pub fn read(
    mut stream: impl Read,
    encoding: Encoding,
    kind: Kind,
    max_items: u32,
    origin: &str,
) -> Result<Items, DataError> {
    let stream_error = |e: io::Error| match encoding {
        Encoding::Gzip => corrupt(origin, Corruption::BadGzip(e.to_string())),
        Encoding::Raw { .. } => DataError::Io {
            path: PathBuf::from(origin),
            source: e,
        },
    };
    let header_len = kind.header_bytes();
    let mut header = [0u8; 16];
    let header = &mut header[..header_len];
    let got = read_full(&mut stream, header).map_err(stream_error)?;
    let count = check_header(&header[..got], kind, max_items, origin)?;
    // At most 2^32 items of 784 bytes: no overflow in u64.
    let body_len = count as u64 * kind.item_bytes();
    let expected = header_len as u64 + body_len;
    if let Encoding::Raw { len } = encoding {
        check_length(len, expected, origin)?;
    }
    let bytes = read_at_most(&mut stream, body_len).map_err(stream_error)?;
    let found = header_len as u64 + bytes.len() as u64;
    if found < expected {
        return Err(corrupt(origin, Corruption::Truncated { expected, found }));
    }
    let extra = count_rest(&mut stream, TRAILING_COUNT_LIMIT).map_err(stream_error)?;
    if extra > 0 {
        let exact = extra < TRAILING_COUNT_LIMIT;
        return Err(corrupt(origin, Corruption::TrailingBytes { extra, exact }));
    }
    if kind == Kind::Labels {
        check_labels(&bytes, origin)?;
    }
    Ok(Items {
        count: count as usize,
        bytes,
    })
}

fn be_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// Checks a header (`header` holds the bytes read, fewer than a full header when the file
/// is shorter) and returns the item count it declares.
fn check_header(header: &[u8], kind: Kind, max_items: u32, origin: &str) -> Result<u32, DataError> {
    let short = |expected: usize| {
        corrupt(
            origin,
            Corruption::Truncated {
                expected: expected as u64,
                found: header.len() as u64,
            },
        )
    };
    if header.len() < 4 {
        return Err(short(4));
    }
    let found = be_u32(header, 0);
    if found != kind.magic() {
        return Err(corrupt(
            origin,
            Corruption::WrongMagic {
                found,
                expected: kind.magic(),
            },
        ));
    }
    if header.len() < kind.header_bytes() {
        return Err(short(kind.header_bytes()));
    }
    if kind == Kind::Images {
        let (rows, cols) = (be_u32(header, 8), be_u32(header, 12));
        if rows as usize != SIDE || cols as usize != SIDE {
            return Err(corrupt(origin, Corruption::BadDims { rows, cols }));
        }
    }
    let count = be_u32(header, 4);
    if count > max_items {
        return Err(corrupt(
            origin,
            Corruption::TooManyItems {
                count,
                max: max_items,
            },
        ));
    }
    Ok(count)
}

/// Checks an uncompressed file's length against the size its header declares.
fn check_length(len: u64, expected: u64, origin: &str) -> Result<(), DataError> {
    if len < expected {
        return Err(corrupt(
            origin,
            Corruption::Truncated {
                expected,
                found: len,
            },
        ));
    }
    if len > expected {
        return Err(corrupt(
            origin,
            Corruption::TrailingBytes {
                extra: len - expected,
                exact: true,
            },
        ));
    }
    Ok(())
}

/// Checks that every label is in `0..10`.
fn check_labels(labels: &[u8], origin: &str) -> Result<(), DataError> {
    match labels.iter().position(|&l| l >= CLASSES) {
        Some(index) => Err(corrupt(
            origin,
            Corruption::LabelOutOfRange {
                index,
                label: labels[index],
            },
        )),
        None => Ok(()),
    }
}

/// Fills `buf` from `stream`, stopping early only at the end of the stream; returns the
/// number of bytes read.
fn read_full(stream: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match stream.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Reads up to `limit` bytes (fewer when the stream ends first). The buffer grows as data
/// arrives: its capacity is never more than `limit`, nor more than twice the bytes read
/// plus one read chunk, so a stream that ends early costs only what it delivered.
fn read_at_most(stream: &mut impl Read, limit: u64) -> io::Result<Vec<u8>> {
    let limit = usize::try_from(limit).map_err(|_| {
        io::Error::new(
            io::ErrorKind::OutOfMemory,
            "the declared size exceeds the address space",
        )
    })?;
    let mut chunk = vec![0u8; READ_CHUNK.min(limit)];
    let mut out: Vec<u8> = Vec::new();
    while out.len() < limit {
        let want = chunk.len().min(limit - out.len());
        let got = read_full(stream, &mut chunk[..want])?;
        if got == 0 {
            break;
        }
        if out.capacity() - out.len() < got {
            let grow = out.len().max(READ_CHUNK).min(limit - out.len());
            out.reserve_exact(grow.max(got));
        }
        out.extend_from_slice(&chunk[..got]);
    }
    Ok(out)
}

/// Counts the bytes left in `stream`, reading at most `limit` of them (through a fixed
/// buffer; nothing is kept). Reaching the end also checks a gzip stream's trailer.
fn count_rest(stream: &mut impl Read, limit: u64) -> io::Result<u64> {
    io::copy(&mut stream.take(limit), &mut io::sink())
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
