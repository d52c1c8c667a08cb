//! Data files, data options, empty tensors and model input shapes.
//!
//! - Empty tensors (a zero-length dimension) through every format family, rounding mode,
//!   dtype and entry point: `quantize`, `quantize_no_grad`, `quantize_`, a `Quantizer`'s
//!   backward, `pack`/`unpack`, and the `quantize` command. Block formats with a `dim`
//!   scope once divided by the empty dimension.
//! - IDX files that declare or inflate to gigabytes (a gzip bomb, a header with millions of
//!   images, a sparse uncompressed file): refused after reading the header and at most the
//!   declared bytes, checked both by the largest allocation and by running the tool with a
//!   limited heap. Bytes after the last gzip member are an error; a file of
//!   several gzip members is read whole, as `gunzip` reads it.
//! - `--data` and `--data-dir`: unknown names list every choice (`embedded` included), a
//!   data directory that is a file or missing says so, and a directory given with the
//!   embedded subset is refused rather than ignored.
//! - Images of the wrong shape for a model (CifarNet on 28x28 data) say what the model needs
//!   and what the data has, through the library and the `train` command.
//! - Seeded mutation passes over the IDX reader (gzip and uncompressed), `Format` and
//!   `Rounding` strings and `QConfig` TOML and JSON: no panic, and no allocation beyond a
//!   small multiple of what the input justifies.

use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::process::Output;

use candle_core::{DType, Device, Module, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use flate2::write::GzEncoder;
use flate2::{Compress, Compression, Crc, FlushCompress};
use qcandle::data::idx::{self, Kind};
use qcandle::data::{self, Corruption, DataError, DataSource, DatasetName, FILES};
use qcandle::format::BlockScope;
use qcandle::nn::{CifarNet, ModelKind, QConfig};
use qcandle::{pack, quantize, quantize_, quantize_no_grad, unpack, Format, Quant, Quantizer};
use qcandle::{FormatError, Rounding};

use super::{largest_allocation, Rng};
use crate::cli::{assert_clean_failure, qcandle, qcandle_after, stderr, stdout};

// ---------------------------------------------------------------------------------------
// Empty tensors
// ---------------------------------------------------------------------------------------

/// One or more formats of every family, and every block scope.
const EMPTY_FORMATS: [&str; 16] = [
    "posit<8,0>",
    "posit<16,1>",
    "posit<32,2>",
    "e4m3",
    "bf16",
    "float<5,2>",
    "float<8,23>",
    "fixed<8,4>",
    "fixed<16,8,noclamp,sym>",
    "block<8>",
    "block<8,dim=0>",
    "block<8,dim=1>",
    "block<8,dim=2>",
    "block<8,dim=-1>",
    "block<4,dim=-2>",
    "block<8,dim=-3>",
];

const EMPTY_ROUNDINGS: [&str; 4] = ["nearest-even", "toward-zero", "stochastic", "stochastic:8"];

const EMPTY_SHAPES: [&[usize]; 5] = [&[0], &[0, 4], &[4, 0], &[2, 0, 3], &[0, 0]];

const FLOAT_DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// Whether `format` can round a tensor of rank `rank`: a block `dim` must name one of its
/// dimensions (else the error is expected, empty tensor or not).
fn scope_fits(format: &Format, rank: usize) -> bool {
    match format {
        Format::Block(b) => match b.scope() {
            BlockScope::Dim(d) => (-(rank as i64)..rank as i64).contains(&d),
            BlockScope::Tensor => true,
        },
        _ => true,
    }
}

/// Checks one entry point's result on an empty tensor of shape `dims`: the same empty
/// shape when the format fits, the out-of-range error when it does not.
fn expect_empty(
    what: &str,
    result: candle_core::Result<Tensor>,
    dims: &[usize],
    fits: bool,
) -> Result<(), String> {
    match (result, fits) {
        (Ok(t), true) if t.dims() == dims => Ok(()),
        (Ok(t), true) => Err(format!("{what}: shape {:?}, expected {dims:?}", t.dims())),
        (Ok(_), false) => Err(format!("{what}: accepted a block dim out of range")),
        (Err(e), false) if e.to_string().contains("out of range") => Ok(()),
        (Err(e), _) => Err(format!("{what}: {e}")),
    }
}

/// Every entry point on an empty tensor of `shape` (and its transpose, a strided view).
fn check_empty(format: &str, rounding: &str, shape: &[usize], dtype: DType) -> Result<(), String> {
    let e = |e: candle_core::Error| e.to_string();
    let f: Format = format.parse().map_err(|e: FormatError| e.to_string())?;
    let q = Quant::new(f)
        .with_rounding(rounding.parse().map_err(|e: FormatError| e.to_string())?)
        .with_seed(7);
    let fits = scope_fits(&f, shape.len());
    let x = Tensor::zeros(shape, dtype, &Device::Cpu).map_err(e)?;
    let mut views = vec![x.clone()];
    if shape.len() >= 2 {
        views.push(x.t().map_err(e)?);
    }
    for v in &views {
        let dims = v.dims();
        expect_empty("quantize", quantize(v, &q), dims, fits)?;
        expect_empty("quantize_no_grad", quantize_no_grad(v, &q), dims, fits)?;
        let in_place = quantize_(v, &q).map(|()| v.clone());
        expect_empty("quantize_", in_place, dims, fits)?;
    }
    check_empty_backward(&q, shape, dtype, fits)?;
    check_empty_pack(&f, &x)
}

/// A `Quantizer`'s backward rounds the (empty) gradient.
fn check_empty_backward(
    q: &Quant,
    shape: &[usize],
    dtype: DType,
    fits: bool,
) -> Result<(), String> {
    let e = |e: candle_core::Error| e.to_string();
    let var = Var::zeros(shape, dtype, &Device::Cpu).map_err(e)?;
    let quantizer = Quantizer::new(None, Some(q.clone()));
    let y = quantizer.forward(var.as_tensor()).map_err(e)?;
    let grads = y.sum_all().and_then(|s| s.backward());
    let grad = grads.and_then(|g| {
        g.get(var.as_tensor())
            .cloned()
            .ok_or_else(|| candle_core::Error::Msg("no gradient".into()))
    });
    expect_empty("Quantizer backward", grad, shape, fits)
}

/// pack and unpack keep the empty shape (posit and float formats; the others are refused
/// as for any tensor).
fn check_empty_pack(f: &Format, x: &Tensor) -> Result<(), String> {
    let packed = pack(x, f);
    if matches!(f, Format::Fixed(_) | Format::Block(_)) {
        return match packed {
            Err(e) if e.to_string().contains("pack/unpack support") => Ok(()),
            other => Err(format!("pack of {f}: {other:?}")),
        };
    }
    let packed = packed.map_err(|e| format!("pack: {e}"))?;
    expect_empty("pack", Ok(packed.clone()), x.dims(), true)?;
    expect_empty("unpack", unpack(&packed, f), x.dims(), true)
}

#[test]
fn empty_tensors_round_to_empty_tensors_in_every_format_rounding_dtype_and_entry_point() {
    let mut failures = Vec::new();
    let mut cases = 0;
    for format in EMPTY_FORMATS {
        for rounding in EMPTY_ROUNDINGS {
            for shape in EMPTY_SHAPES {
                for dtype in FLOAT_DTYPES {
                    cases += 1;
                    let case = format!("{format} {rounding} {shape:?} {dtype:?}");
                    match catch_unwind(AssertUnwindSafe(|| {
                        check_empty(format, rounding, shape, dtype)
                    })) {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => failures.push(format!("{case}: {e}")),
                        Err(_) => failures.push(format!("{case}: panicked")),
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {cases} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn the_quantize_command_rounds_an_empty_tensor_with_a_block_dim_scope() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in.npy"), dir.path().join("out.npy"));
    Tensor::zeros((4, 0), DType::F32, &Device::Cpu)
        .unwrap()
        .write_npy(&input)
        .unwrap();
    for format in ["block<8,dim=0>", "block<8,dim=1>", "block<8,dim=-1>"] {
        let o = qcandle(&[
            "quantize",
            "--format",
            format,
            input.to_str().unwrap(),
            output.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{format}: {}", stderr(&o));
        let back = Tensor::read_npy(&output).unwrap();
        assert_eq!(back.dims(), [4, 0], "{format}");
    }
}

// ---------------------------------------------------------------------------------------
// IDX files that declare or inflate to gigabytes
// ---------------------------------------------------------------------------------------

/// The IDX bytes of `n` 28x28 images with pixels `i % 251`.
fn idx_images(n: u32) -> Vec<u8> {
    let mut v = Vec::new();
    for w in [idx::IMAGES_MAGIC, n, 28, 28] {
        v.extend_from_slice(&w.to_be_bytes());
    }
    v.extend((0..n as usize * 784).map(|i| (i % 251) as u8));
    v
}

/// The IDX bytes of labels.
fn idx_labels(values: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    for w in [idx::LABELS_MAGIC, values.len() as u32] {
        v.extend_from_slice(&w.to_be_bytes());
    }
    v.extend_from_slice(values);
    v
}

/// One gzip member of `bytes`.
fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// `data` as raw deflate blocks ending on a byte boundary and not final (a sync flush), so
/// such pieces can be concatenated into one stream.
fn deflate_piece(data: &[u8]) -> Vec<u8> {
    let mut c = Compress::new(Compression::fast(), false);
    let mut out = Vec::with_capacity(data.len() + 4096);
    c.compress_vec(data, &mut out, FlushCompress::Sync).unwrap();
    assert_eq!(
        c.total_in() as usize,
        data.len(),
        "the piece is compressed whole"
    );
    out
}

/// One gzip member holding `head` followed by `zero_mib` MiB of zero bytes, made of one
/// compressed MiB repeated: gigabytes of content in a few megabytes, built in milliseconds.
fn gzip_bomb(head: &[u8], zero_mib: usize) -> Vec<u8> {
    let zeros = vec![0u8; 1 << 20];
    let zero_piece = deflate_piece(&zeros);
    let mut zero_crc = Crc::new();
    zero_crc.update(&zeros);
    let mut crc = Crc::new();
    crc.update(head);
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    out.extend(deflate_piece(head));
    for _ in 0..zero_mib {
        out.extend_from_slice(&zero_piece);
        crc.combine(&zero_crc);
    }
    // A final, empty stored block, then the CRC-32 and the length mod 2^32.
    out.extend_from_slice(&[0x01, 0x00, 0x00, 0xff, 0xff]);
    out.extend_from_slice(&crc.sum().to_le_bytes());
    out.extend_from_slice(&crc.amount().to_le_bytes());
    out
}

/// A directory with a valid four-file dataset: 5 training and 3 test items, gzipped.
fn valid_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        idx_images(5),
        idx_labels(&[0, 1, 2, 3, 9]),
        idx_images(3),
        idx_labels(&[4, 5, 6]),
    ];
    for (name, bytes) in FILES.iter().zip(files) {
        std::fs::write(dir.path().join(name), gz(&bytes)).unwrap();
    }
    dir
}

/// Runs the tool with its data segment limited to `mib` MiB (`ulimit -d`, which covers
/// every heap allocation but not thread stacks or reserved address space, so the limit does
/// not depend on the number of cores): an input that makes it allocate gigabytes then fails
/// to allocate instead of filling the machine's memory.
fn qcandle_limited(mib: u64, args: &[&str]) -> Output {
    qcandle_after(&format!("ulimit -d {}", mib * 1024), None, args)
}

/// `qcandle train` on the MNIST files in `dir`, with 1 GiB of heap at most.
fn train_limited(dir: &Path) -> Output {
    let out = dir.join("run");
    qcandle_limited(
        1024,
        &[
            "train",
            "--data",
            "mnist",
            "--data-dir",
            dir.to_str().unwrap(),
            "--epochs",
            "1",
            "--quiet",
            "--out",
            out.to_str().unwrap(),
        ],
    )
}

/// Bytes any IDX read may allocate whatever the file: read buffers and the decompressor's
/// state.
const READER_OVERHEAD: usize = 256 << 10;

#[test]
fn a_gzip_file_inflating_to_gigabytes_is_refused_without_being_read_whole() {
    let dir = valid_dir();
    let path = dir.path().join(FILES[0]);
    std::fs::write(&path, gzip_bomb(&idx_images(5), 2048)).unwrap();

    let (result, largest) = largest_allocation(|| idx::read_file(&path, Kind::Images));
    match result {
        Err(DataError::Corrupt {
            what:
                Corruption::TrailingBytes {
                    extra,
                    exact: false,
                },
            ..
        }) => assert_eq!(extra, 1 << 20, "counting stops after 1 MiB"),
        other => panic!("expected TrailingBytes, got {other:?}"),
    }
    assert!(
        largest < 5 * 784 + READER_OVERHEAD,
        "largest allocation {largest}"
    );

    let o = train_limited(dir.path());
    assert_clean_failure(
        &o,
        &[
            path.to_str().unwrap(),
            "unexpected bytes after the last item",
        ],
    );
}

#[test]
fn a_header_declaring_millions_of_images_is_refused_before_the_body_is_read() {
    let dir = valid_dir();
    let path = dir.path().join(FILES[0]);
    let mut header = idx_images(0);
    header[4..8].copy_from_slice(&4_000_000u32.to_be_bytes());
    std::fs::write(&path, gzip_bomb(&header, 2048)).unwrap();

    let (result, largest) = largest_allocation(|| idx::read_file(&path, Kind::Images));
    match result {
        Err(DataError::Corrupt {
            what: Corruption::TooManyItems { count, max },
            ..
        }) => assert_eq!((count, max), (4_000_000, idx::MAX_ITEMS)),
        other => panic!("expected TooManyItems, got {other:?}"),
    }
    assert!(largest < READER_OVERHEAD, "largest allocation {largest}");

    let o = train_limited(dir.path());
    assert_clean_failure(&o, &[path.to_str().unwrap(), "declares 4000000 items"]);

    // The largest count a header can hold, uncompressed, is refused the same way.
    let mut bytes = idx_labels(&[1, 2]);
    bytes[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
    let err = idx::decode(&bytes, false, Kind::Labels, idx::MAX_ITEMS, "x").unwrap_err();
    assert!(
        err.to_string().contains("declares 4294967295 items"),
        "{err}"
    );
}

#[test]
fn an_uncompressed_file_is_checked_against_its_length_before_its_items_are_read() {
    let dir = valid_dir();
    std::fs::remove_file(dir.path().join(FILES[0])).unwrap();
    let path = dir.path().join(FILES[0].trim_end_matches(".gz"));
    // A sparse 2 GiB file: five valid images, then zeros that take no disk space.
    let file = std::fs::File::create(&path).unwrap();
    (&file).write_all(&idx_images(5)).unwrap();
    file.set_len(2 << 30).unwrap();
    drop(file);

    let (result, largest) = largest_allocation(|| idx::read_file(&path, Kind::Images));
    let extra = (2u64 << 30) - (16 + 5 * 784);
    match result {
        Err(DataError::Corrupt { what, .. }) => {
            assert_eq!(what, Corruption::TrailingBytes { extra, exact: true })
        }
        other => panic!("expected TrailingBytes, got {other:?}"),
    }
    assert!(largest < READER_OVERHEAD, "largest allocation {largest}");
    let o = train_limited(dir.path());
    assert_clean_failure(
        &o,
        &[path.to_str().unwrap(), &format!("{extra} unexpected bytes")],
    );

    // Declaring 200,000 images in a 1000-byte file: truncated, nothing allocated for them.
    let mut short = idx_images(2)[..1000].to_vec();
    short[4..8].copy_from_slice(&200_000u32.to_be_bytes());
    std::fs::write(&path, &short).unwrap();
    let (result, largest) = largest_allocation(|| idx::read_file(&path, Kind::Images));
    match result {
        Err(DataError::Corrupt { what, .. }) => assert_eq!(
            what,
            Corruption::Truncated {
                expected: 16 + 200_000 * 784,
                found: 1000
            }
        ),
        other => panic!("expected Truncated, got {other:?}"),
    }
    assert!(largest < READER_OVERHEAD, "largest allocation {largest}");
}

#[test]
fn bytes_after_the_last_gzip_member_are_an_error_and_several_members_are_read_whole() {
    let dir = valid_dir();
    let path = dir.path().join(FILES[1]);
    let labels = idx_labels(&[0, 1, 2, 3, 9]);
    let mut garbage = gz(&labels);
    garbage.extend_from_slice(b"not gzip at all");
    std::fs::write(&path, &garbage).unwrap();
    let err = data::load(DatasetName::Mnist, Some(dir.path())).unwrap_err();
    match &err {
        DataError::Corrupt {
            path: p,
            what: Corruption::BadGzip(_),
        } => assert_eq!(p, &path.display().to_string()),
        e => panic!("expected BadGzip, got {e:?}"),
    }

    // The same labels as two concatenated gzip members: one valid file (RFC 1952).
    let mut members = gz(&labels[..7]);
    members.extend(gz(&labels[7..]));
    std::fs::write(&path, &members).unwrap();
    let ds = data::load(DatasetName::Mnist, Some(dir.path())).unwrap();
    assert_eq!(ds.train_labels.to_vec1::<u32>().unwrap(), [0, 1, 2, 3, 9]);
}

#[test]
fn short_streams_are_truncated_and_name_the_file_gzip_or_not() {
    let full = idx_images(2);
    for (compressed, name) in [(true, "a.gz"), (false, "a")] {
        let cut = &full[..full.len() - 100];
        let bytes = if compressed { gz(cut) } else { cut.to_vec() };
        let err = idx::decode(&bytes, compressed, Kind::Images, idx::MAX_ITEMS, name).unwrap_err();
        match &err {
            DataError::Corrupt { path, what } => {
                assert_eq!(path, name);
                assert_eq!(
                    *what,
                    Corruption::Truncated {
                        expected: full.len() as u64,
                        found: cut.len() as u64
                    }
                );
            }
            e => panic!("expected Truncated, got {e:?}"),
        }
    }
    // A gzip stream cut inside its compressed data is bad gzip.
    let z = gz(&full);
    let err = idx::decode(&z[..z.len() / 2], true, Kind::Images, 10, "b.gz").unwrap_err();
    assert!(
        matches!(
            err,
            DataError::Corrupt {
                what: Corruption::BadGzip(_),
                ..
            }
        ),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------
// --data and --data-dir
// ---------------------------------------------------------------------------------------

#[test]
fn an_unknown_data_name_lists_every_choice_including_embedded() {
    let out = tempfile::tempdir().unwrap();
    let run = out.path().join("run");
    let o = qcandle(&["train", "--data", "foo", "--out", run.to_str().unwrap()]);
    assert_clean_failure(&o, &["\"foo\"", "fashion-mnist", "mnist", "embedded"]);
    let err = "foo".parse::<DataSource>().unwrap_err();
    assert!(err.to_string().contains("embedded"), "{err}");
    assert_eq!(
        "embedded".parse::<DataSource>().unwrap(),
        DataSource::Embedded
    );
    assert_eq!(
        "mnist".parse::<DataSource>().unwrap(),
        DataSource::Files(DatasetName::Mnist)
    );
    for command in ["train", "ptq"] {
        let help = stdout(&qcandle(&[command, "--help"]));
        let after = help.split("--data <").nth(1).unwrap_or("");
        let entry = after.split("--data-dir").next().unwrap_or("");
        assert!(
            entry.contains("embedded"),
            "{command} --help, --data: {entry}"
        );
    }
}

#[test]
fn a_data_dir_that_is_a_file_or_missing_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("images.gz");
    std::fs::write(&file, b"x").unwrap();
    let missing = tmp.path().join("missing");
    let run = tmp.path().join("run");
    for (dir, words) in [
        (&file, "is a file, not a directory"),
        (&missing, "does not exist"),
    ] {
        let o = qcandle(&[
            "train",
            "--data",
            "fashion-mnist",
            "--data-dir",
            dir.to_str().unwrap(),
            "--out",
            run.to_str().unwrap(),
        ]);
        assert_clean_failure(&o, &[dir.to_str().unwrap(), words]);
    }
    let err = data::load(DatasetName::Mnist, Some(&file)).unwrap_err();
    assert!(matches!(err, DataError::NotADirectory { .. }), "{err:?}");
}

#[test]
fn a_dataset_file_that_is_a_directory_says_so() {
    // A compressed name, and an uncompressed one standing in for a missing .gz.
    for (file, directory) in [
        (FILES[0], FILES[0]),
        (FILES[1], FILES[1].trim_end_matches(".gz")),
    ] {
        let dir = valid_dir();
        std::fs::remove_file(dir.path().join(file)).unwrap();
        let path = dir.path().join(directory);
        std::fs::create_dir(&path).unwrap();
        let err = data::load(DatasetName::Mnist, Some(dir.path())).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DataError::Io { .. }), "{err:?}");
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains("is a directory, not a file"), "{msg}");
    }
}

#[test]
fn a_data_dir_given_with_the_embedded_subset_is_refused_not_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let o = qcandle(&[
        "train",
        "--data",
        "embedded",
        "--data-dir",
        tmp.path().to_str().unwrap(),
        "--epochs",
        "1",
        "--quiet",
        "--out",
        run.to_str().unwrap(),
    ]);
    assert_clean_failure(
        &o,
        &["embedded", "cannot be used", tmp.path().to_str().unwrap()],
    );
    assert!(!run.exists(), "nothing was created");
}

// ---------------------------------------------------------------------------------------
// Model input shapes
// ---------------------------------------------------------------------------------------

#[test]
fn check_input_names_what_the_model_needs_and_what_the_data_has() {
    let cifar = ModelKind::CifarNet;
    for dims in [&[1, 28, 28][..], &[64, 1, 28, 28]] {
        let err = cifar.check_input(dims).unwrap_err().to_string();
        assert!(
            err.contains("cifarnet needs 3x32x32 images; the data has 1x28x28"),
            "{err}"
        );
    }
    assert!(cifar.check_input(&[3, 32, 32]).is_ok());
    assert!(cifar.check_input(&[7, 3, 32, 32]).is_ok());
    for (kind, _) in ModelKind::ALL {
        let (c, h, w) = kind.input_shape();
        assert!(kind.check_input(&[2, c, h, w]).is_ok(), "{kind}");
        let err = kind.check_input(&[2, c, h + 1, w]).unwrap_err().to_string();
        assert!(
            err.contains(&format!("{kind} needs {c}x{h}x{w} images")),
            "{err}"
        );
        let err = kind.check_input(&[c * h * w]).unwrap_err().to_string();
        assert!(err.contains(&format!("[{}]", c * h * w)), "{err}");
    }
}

#[test]
fn every_model_checks_its_input_shape_before_its_first_layer() {
    let dev = Device::Cpu;
    let wrong = |kind: ModelKind| {
        let (c, h, w) = kind.input_shape();
        if c == 3 {
            (2, 1, 28, 28)
        } else {
            (2, 3, h + 4, w + 4)
        }
    };
    for (kind, name) in ModelKind::ALL {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
        let model = kind.build(vb, &QConfig::default()).unwrap();
        let x = Tensor::zeros(wrong(kind), DType::F32, &dev).unwrap();
        let err = model.forward(&x).unwrap_err().to_string();
        let (c, h, w) = kind.input_shape();
        assert!(
            err.contains(&format!("{name} needs {c}x{h}x{w} images")),
            "{name}: {err}"
        );
        let x = Tensor::zeros((2, c, h, w), DType::F32, &dev).unwrap();
        assert_eq!(model.forward(&x).unwrap().dims(), [2, 10], "{name}");
    }
    // The layer stacks are models on their own too.
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let net = CifarNet::new(vb, &QConfig::default()).unwrap();
    let x = Tensor::zeros((2, 1, 28, 28), DType::F32, &dev).unwrap();
    let err = net.forward(&x).unwrap_err().to_string();
    assert!(
        err.contains("cifarnet needs 3x32x32 images; the data has 1x28x28"),
        "{err}"
    );
}

#[test]
fn training_cifarnet_on_28x28_data_says_which_shape_it_needs() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let o = qcandle(&[
        "train",
        "--model",
        "cifarnet",
        "--data",
        "embedded",
        "--epochs",
        "1",
        "--quiet",
        "--out",
        run.to_str().unwrap(),
    ]);
    assert_clean_failure(
        &o,
        &["cifarnet needs 3x32x32 images", "the data has 1x28x28"],
    );
}

// ---------------------------------------------------------------------------------------
// Mutation passes
// ---------------------------------------------------------------------------------------

/// `count` mutations of the seeds (round robin), from the generator seeded with `seed`.
fn mutations(seed: u64, seeds: &[Vec<u8>], count: usize) -> impl Iterator<Item = Vec<u8>> + '_ {
    let mut rng = Rng::new(seed);
    (0..count).map(move |n| rng.mutate(&seeds[n % seeds.len()]))
}

/// Runs `parse` on every input, checking that none panics and that none allocates more
/// than `bound(input)` bytes in one request. Returns the number of inputs tried.
fn check_inputs(
    name: &str,
    inputs: impl Iterator<Item = Vec<u8>>,
    bound: impl Fn(&[u8]) -> usize,
    parse: impl Fn(&[u8]),
) -> usize {
    let (mut count, mut worst) = (0, (0usize, 0usize));
    for input in inputs {
        let (outcome, largest) =
            largest_allocation(|| catch_unwind(AssertUnwindSafe(|| parse(&input))));
        let shown = String::from_utf8_lossy(&input);
        assert!(outcome.is_ok(), "{name}: input {count} panicked: {shown:?}");
        let limit = bound(&input);
        assert!(
            largest <= limit,
            "{name}: input {count} ({} bytes) allocated {largest} bytes at once (bound {limit}): \
             {shown:?}",
            input.len(),
        );
        worst = worst.max((largest, input.len()));
        count += 1;
    }
    println!(
        "{name}: {count} mutated inputs, no panic, largest allocation {} bytes (input of {} bytes)",
        worst.0, worst.1
    );
    count
}

/// Items the IDX mutation passes allow per file: the bound on what a gzip input may
/// allocate is a multiple of the size this allows.
const FUZZ_MAX_ITEMS: u32 = 8;

fn idx_seeds() -> Vec<(Kind, Vec<u8>)> {
    vec![
        (Kind::Images, idx_images(3)),
        (Kind::Images, idx_images(0)),
        (Kind::Labels, idx_labels(&[0, 1, 2, 3, 4, 5, 6, 7])),
        (Kind::Labels, idx_labels(&[9])),
    ]
}

/// Decodes `input` as both kinds (a mutation may turn one into the other).
fn decode_both(input: &[u8], compressed: bool, max_items: u32) {
    for kind in [Kind::Images, Kind::Labels] {
        let _ = idx::decode(input, compressed, kind, max_items, "fuzz");
    }
}

#[test]
fn mutation_pass_over_the_idx_reader_gzip() {
    let raw: Vec<Vec<u8>> = idx_seeds().into_iter().map(|(_, b)| b).collect();
    let compressed: Vec<Vec<u8>> = raw.iter().map(|b| gz(b)).collect();
    let allowed = 16 + FUZZ_MAX_ITEMS as usize * 784;
    let bound = |_: &[u8]| 2 * allowed + READER_OVERHEAD;
    let decode = |b: &[u8]| decode_both(b, true, FUZZ_MAX_ITEMS);
    // Mutated compressed bytes: the gzip layer.
    let inputs = mutations(1, &compressed, 100_000);
    let a = check_inputs("idx gzip (compressed bytes mutated)", inputs, bound, decode);
    // Mutated IDX bytes, then compressed: the header checks behind the gzip layer.
    let inputs = mutations(2, &raw, 60_000).map(|b| gz(&b));
    let b = check_inputs("idx gzip (content mutated)", inputs, bound, decode);
    println!("idx gzip: {} inputs", a + b);
}

#[test]
fn mutation_pass_over_the_idx_reader_uncompressed() {
    let seeds: Vec<Vec<u8>> = idx_seeds().into_iter().map(|(_, b)| b).collect();
    // Production limits: the length check bounds what the file may make the reader hold.
    check_inputs(
        "idx uncompressed",
        mutations(3, &seeds, 150_000),
        |input| 2 * input.len() + READER_OVERHEAD,
        |b| decode_both(b, false, idx::MAX_ITEMS),
    );
}

#[test]
fn format_strings_with_huge_numbers_are_errors() {
    for s in [
        "posit<4294967297,2>",
        "posit<8,4294967297>",
        "posit<18446744073709551617,0>",
        "float<99999999999,1>",
        "float<5,99999999999>",
        "float<-1,2>",
        "fixed<99999999999,2>",
        "fixed<8,99999999999>",
        "fixed<8,-4611686018427387905>",
        "block<4294967297>",
        "block<8,dim=99999999999999999999>",
    ] {
        let (result, largest) = largest_allocation(|| s.parse::<Format>());
        assert!(result.is_err(), "{s} parsed as {result:?}");
        assert!(largest < 4096, "{s}: allocated {largest}");
    }
    for s in [
        "stochastic:4294967297",
        "stochastic:-1",
        "stochastic:99999999999",
    ] {
        assert!(s.parse::<Rounding>().is_err(), "{s}");
    }
}

/// Bound on what a text parser may allocate for `input`.
fn text_bound(input: &[u8]) -> usize {
    16 * input.len() + 64 * 1024
}

#[test]
fn mutation_pass_over_format_and_rounding_strings() {
    let mut formats: Vec<Vec<u8>> = Format::presets()
        .iter()
        .flat_map(|(name, _, f)| [name.to_string(), f.to_string()])
        .map(String::into_bytes)
        .collect();
    for s in [
        "posit<8,0>",
        "posit<16,1>",
        "float<5,2,nosub,sat>",
        "float<4,3,fn>",
        "float<2,1,fin>",
        "fixed<8,4,noclamp,sym>",
        "fixed<16,-3>",
        "block<8,dim=-1>",
        "block<4>",
    ] {
        formats.push(s.as_bytes().to_vec());
    }
    let inputs = mutations(4, &formats, 200_000);
    let a = check_inputs("Format::from_str", inputs, text_bound, |b| {
        let _ = String::from_utf8_lossy(b).parse::<Format>();
    });
    let roundings: Vec<Vec<u8>> = [
        "nearest-even",
        "nearest-away",
        "toward-zero",
        "stochastic",
        "stochastic:8",
        "rne",
        "sr",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    let b = check_inputs(
        "Rounding::from_str",
        mutations(5, &roundings, 80_000),
        text_bound,
        |b| {
            let _ = String::from_utf8_lossy(b).parse::<Rounding>();
        },
    );
    println!("format and rounding strings: {} inputs", a + b);
}

/// Config seeds: every preset and a file with layer overrides, as TOML or JSON.
fn config_seeds(json: bool) -> Vec<Vec<u8>> {
    let overrides = QConfig::from_toml(
        "seed = 7\nweight = \"posit<16,1>\"\n\
         gradient = { format = \"posit<16,1>\", rounding = \"stochastic:8\" }\n\
         momentum = \"block<8,dim=0>\"\n\
         [[layer]]\npattern = \"fc*\"\nweight = \"none\"\nerror = \"e5m2\"\n\
         [[layer]]\npattern = \"conv?\"\nactivation = { format = \"fixed<8,4>\", rounding = \"toward-zero\" }\n",
    )
    .expect("the seed config parses");
    let mut configs: Vec<QConfig> = qcandle::nn::config::presets()
        .iter()
        .map(|(name, _)| QConfig::preset(name).unwrap())
        .collect();
    configs.push(overrides);
    configs
        .iter()
        .map(|c| if json { c.to_json() } else { c.to_toml() }.into_bytes())
        .collect()
}

#[test]
fn mutation_pass_over_config_files() {
    let a = check_inputs(
        "QConfig::from_toml",
        mutations(6, &config_seeds(false), 100_000),
        text_bound,
        |b| {
            let _ = QConfig::from_toml(&String::from_utf8_lossy(b));
        },
    );
    let b = check_inputs(
        "QConfig::from_json",
        mutations(7, &config_seeds(true), 100_000),
        text_bound,
        |b| {
            let _ = QConfig::from_json(&String::from_utf8_lossy(b));
        },
    );
    println!("config files: {} inputs", a + b);
}
