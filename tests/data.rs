//! The dataset module: MNIST and Fashion-MNIST load from their IDX files with the known
//! sizes and first labels, the embedded subset is the head of Fashion-MNIST, corrupt and
//! missing files give named errors, and the training shuffle is a reproducible permutation.
//!
//! The full datasets are optional: MNIST is read from `QCANDLE_MNIST_DIR`, else
//! `CARGO_MANIFEST_DIR/../shared/data/mnist`; Fashion-MNIST from
//! `/usr/share/datasets/fashion-mnist`. Tests that need an absent one print a note and pass.

use std::io::Write;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use flate2::write::GzEncoder;
use flate2::Compression;
use qcandle::data::{
    self, permutation, resolve_dir, Corruption, DataError, Dataset, DatasetName, FILES,
};

fn mnist_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("QCANDLE_MNIST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/mnist"));
    if dir.join(FILES[0]).exists() {
        Some(dir)
    } else {
        eprintln!(
            "note: MNIST not found in {} (set QCANDLE_MNIST_DIR); skipping",
            dir.display()
        );
        None
    }
}

fn fashion_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(data::FASHION_MNIST_DEFAULT_DIR);
    if dir.join(FILES[0]).exists() {
        Some(dir)
    } else {
        eprintln!(
            "note: Fashion-MNIST not found in {} (apt-get install dataset-fashion-mnist); skipping",
            dir.display()
        );
        None
    }
}

fn labels(t: &Tensor) -> Vec<u32> {
    t.to_vec1::<u32>().unwrap()
}

// ---- Synthetic IDX files ----

fn idx_images(n: u32, rows: u32, cols: u32, pixel: impl Fn(usize) -> u8) -> Vec<u8> {
    let mut v = Vec::new();
    for w in [0x0000_0803u32, n, rows, cols] {
        v.extend_from_slice(&w.to_be_bytes());
    }
    v.extend((0..(n * rows * cols) as usize).map(pixel));
    v
}

fn idx_labels(values: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    for w in [0x0000_0801u32, values.len() as u32] {
        v.extend_from_slice(&w.to_be_bytes());
    }
    v.extend_from_slice(values);
    v
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// A directory with a valid four-file dataset: 5 training and 3 test items, gzipped.
fn valid_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        idx_images(5, 28, 28, |i| (i % 256) as u8),
        idx_labels(&[0, 1, 2, 3, 9]),
        idx_images(3, 28, 28, |i| (i % 7) as u8),
        idx_labels(&[4, 5, 6]),
    ];
    for (name, bytes) in FILES.iter().zip(files) {
        std::fs::write(dir.path().join(name), gz(&bytes)).unwrap();
    }
    dir
}

fn load_from(dir: &Path) -> Result<Dataset, DataError> {
    data::load(DatasetName::Mnist, Some(dir))
}

/// Replaces file `index` of a valid directory with `bytes` (written as is) and loads it.
fn load_with(index: usize, bytes: Vec<u8>) -> (DataError, PathBuf) {
    let dir = valid_dir();
    let path = dir.path().join(FILES[index]);
    std::fs::write(&path, bytes).unwrap();
    let err = load_from(dir.path()).expect_err("the corrupt file is rejected");
    (err, path)
}

fn corruption(err: &DataError, path: &Path) -> Corruption {
    let msg = err.to_string();
    assert!(
        msg.contains(&path.display().to_string()),
        "message names the file: {msg}"
    );
    match err {
        DataError::Corrupt { what, .. } => what.clone(),
        e => panic!("expected Corrupt, got {e:?}"),
    }
}

// ---- Full datasets ----

#[test]
fn mnist_has_60000_train_and_10000_test_images_with_the_official_first_labels() {
    let Some(dir) = mnist_dir() else { return };
    let ds = data::load(DatasetName::Mnist, Some(&dir)).unwrap();
    assert_eq!(ds.name, DatasetName::Mnist);
    assert_eq!(ds.train_images.dims(), [60000, 1, 28, 28]);
    assert_eq!(ds.train_labels.dims(), [60000]);
    assert_eq!(ds.test_images.dims(), [10000, 1, 28, 28]);
    assert_eq!(ds.test_labels.dims(), [10000]);
    assert_eq!(ds.train_images.dtype(), DType::F32);
    assert_eq!(ds.train_labels.dtype(), DType::U32);
    assert_eq!(
        labels(&ds.train_labels.narrow(0, 0, 10).unwrap()),
        [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    );
    assert_eq!(
        labels(&ds.test_labels.narrow(0, 0, 10).unwrap()),
        [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    );
    assert_eq!(ds.source, dir.display().to_string());
}

#[test]
fn mnist_pixels_are_scaled_to_minus_one_to_one_matching_the_first_images_pixel_sum() {
    let Some(dir) = mnist_dir() else { return };
    let ds = data::load(DatasetName::Mnist, Some(&dir)).unwrap();
    let all = ds.train_images.flatten_all().unwrap();
    assert_eq!(all.min(0).unwrap().to_scalar::<f32>().unwrap(), -1.0);
    assert_eq!(all.max(0).unwrap().to_scalar::<f32>().unwrap(), 1.0);
    // The first training image's raw pixels sum to 27525 over 784 pixels.
    let first: Vec<f32> = ds
        .train_images
        .get(0)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let sum: f64 = first.iter().map(|&x| x as f64).sum();
    let expected = 27525.0 / 127.5 - 784.0;
    assert!((sum - expected).abs() < 1e-3, "{sum} vs {expected}");
}

#[test]
fn fashion_mnist_loads_from_the_debian_package_directory_with_its_first_labels() {
    let Some(dir) = fashion_dir() else { return };
    let ds = data::load(DatasetName::FashionMnist, Some(&dir)).unwrap();
    assert_eq!(ds.train_images.dims(), [60000, 1, 28, 28]);
    assert_eq!(ds.test_images.dims(), [10000, 1, 28, 28]);
    assert_eq!(
        labels(&ds.train_labels.narrow(0, 0, 10).unwrap()),
        [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]
    );
    assert_eq!(
        labels(&ds.test_labels.narrow(0, 0, 10).unwrap()),
        [9, 2, 1, 1, 6, 1, 4, 6, 5, 7]
    );
}

// ---- Embedded subset ----

#[test]
fn embedded_subset_has_6000_train_and_1000_test_fashion_items() {
    let ds = data::embedded().unwrap();
    assert_eq!(ds.name, DatasetName::FashionMnist);
    assert_eq!(ds.source, "embedded");
    assert_eq!(ds.train_images.dims(), [data::EMBEDDED_TRAIN, 1, 28, 28]);
    assert_eq!(ds.train_labels.dims(), [6000]);
    assert_eq!(ds.test_images.dims(), [data::EMBEDDED_TEST, 1, 28, 28]);
    assert_eq!(ds.test_labels.dims(), [1000]);
    assert_eq!(
        labels(&ds.train_labels.narrow(0, 0, 10).unwrap()),
        [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]
    );
    // Every class is present in the training subset.
    let mut seen = [0usize; 10];
    for l in labels(&ds.train_labels) {
        seen[l as usize] += 1;
    }
    assert!(seen.iter().all(|&c| c > 400), "{seen:?}");
}

#[test]
fn embedded_subset_equals_the_first_6000_and_1000_items_of_fashion_mnist() {
    let Some(dir) = fashion_dir() else { return };
    let full = data::load(DatasetName::FashionMnist, Some(&dir)).unwrap();
    let head = full.subset(6000, 1000).unwrap();
    let emb = data::embedded().unwrap();
    let eq = |a: &Tensor, b: &Tensor| {
        a.dims() == b.dims()
            && a.eq(b)
                .unwrap()
                .flatten_all()
                .unwrap()
                .min(0)
                .unwrap()
                .to_scalar::<u8>()
                .unwrap()
                == 1
    };
    assert!(eq(&emb.train_images, &head.train_images));
    assert!(eq(&emb.train_labels, &head.train_labels));
    assert!(eq(&emb.test_images, &head.test_images));
    assert!(eq(&emb.test_labels, &head.test_labels));
}

// ---- Synthetic files: decoding, scaling, fallbacks ----

#[test]
fn pixel_x_becomes_x_over_127_5_minus_1_so_0_is_minus_1_and_255_is_1() {
    let dir = valid_dir();
    let ds = load_from(dir.path()).unwrap();
    assert_eq!(ds.train_images.dims(), [5, 1, 28, 28]);
    let got: Vec<f32> = ds.train_images.flatten_all().unwrap().to_vec1().unwrap();
    for (i, &v) in got.iter().enumerate() {
        assert_eq!(v, (i % 256) as f32 / 127.5 - 1.0, "pixel {i}");
    }
    assert_eq!(got[0], -1.0);
    assert_eq!(got[255], 1.0);
    assert_eq!(labels(&ds.train_labels), [0, 1, 2, 3, 9]);
    assert_eq!(labels(&ds.test_labels), [4, 5, 6]);
}

#[test]
fn uncompressed_files_are_read_when_the_gz_is_absent() {
    let dir = valid_dir();
    // Replace the training images by an uncompressed file of different content.
    std::fs::remove_file(dir.path().join(FILES[0])).unwrap();
    let raw = dir.path().join(FILES[0].trim_end_matches(".gz"));
    std::fs::write(&raw, idx_images(5, 28, 28, |_| 255)).unwrap();
    let ds = load_from(dir.path()).unwrap();
    let min = ds.train_images.flatten_all().unwrap().min(0).unwrap();
    assert_eq!(min.to_scalar::<f32>().unwrap(), 1.0);
}

// ---- Errors ----

#[test]
fn truncated_gzip_is_a_bad_gzip_error_naming_the_file() {
    let good = gz(&idx_images(5, 28, 28, |i| (i * 31 % 256) as u8));
    let (err, path) = load_with(0, good[..good.len() / 2].to_vec());
    assert!(
        matches!(corruption(&err, &path), Corruption::BadGzip(_)),
        "{err}"
    );
}

#[test]
fn non_gzip_bytes_in_a_gz_file_are_a_bad_gzip_error() {
    let (err, path) = load_with(1, idx_labels(&[0, 1, 2, 3, 4]));
    assert!(
        matches!(corruption(&err, &path), Corruption::BadGzip(_)),
        "{err}"
    );
}

#[test]
fn wrong_magic_is_reported_with_found_and_expected_values() {
    // A labels file where the images file should be.
    let (err, path) = load_with(0, gz(&idx_labels(&[0, 1, 2, 3, 4])));
    assert_eq!(
        corruption(&err, &path),
        Corruption::WrongMagic {
            found: 0x801,
            expected: 0x803
        }
    );
    assert!(err.to_string().contains("0x00000801"), "{err}");
}

#[test]
fn images_that_are_not_28x28_are_bad_dims() {
    let (err, path) = load_with(2, gz(&idx_images(3, 32, 32, |_| 0)));
    assert_eq!(
        corruption(&err, &path),
        Corruption::BadDims { rows: 32, cols: 32 }
    );
}

#[test]
fn an_idx_body_shorter_than_its_header_says_is_truncated() {
    let mut bytes = idx_images(5, 28, 28, |_| 0);
    bytes.truncate(bytes.len() - 1);
    let (err, path) = load_with(0, gz(&bytes));
    assert_eq!(
        corruption(&err, &path),
        Corruption::Truncated {
            expected: 16 + 5 * 784,
            found: 16 + 5 * 784 - 1
        }
    );
    // A header cut short is truncated too.
    let (err, path) = load_with(1, gz(&[0, 0, 8, 1, 0]));
    assert!(
        matches!(corruption(&err, &path), Corruption::Truncated { .. }),
        "{err}"
    );
}

#[test]
fn label_10_is_out_of_range_with_its_index() {
    let (err, path) = load_with(3, gz(&idx_labels(&[4, 10, 6])));
    assert_eq!(
        corruption(&err, &path),
        Corruption::LabelOutOfRange {
            index: 1,
            label: 10
        }
    );
}

#[test]
fn image_and_label_counts_must_match() {
    let (err, path) = load_with(1, gz(&idx_labels(&[0, 1, 2, 3])));
    // Reported against the images file, naming the labels file too.
    let images = path.with_file_name(FILES[0]);
    match corruption(&err, &images) {
        Corruption::CountMismatch {
            images,
            labels,
            labels_origin,
        } => {
            assert_eq!((images, labels), (5, 4));
            assert_eq!(labels_origin, path.display().to_string());
        }
        c => panic!("expected CountMismatch, got {c:?}"),
    }
}

#[test]
fn a_missing_directory_is_named_with_how_to_get_the_data() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("nope");
    let err = data::load(DatasetName::FashionMnist, Some(&dir)).unwrap_err();
    assert!(matches!(err, DataError::MissingDirectory { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&dir.display().to_string()), "{msg}");
    assert!(
        msg.contains("apt-get install dataset-fashion-mnist"),
        "{msg}"
    );
    assert!(
        msg.contains("--data-dir") && msg.contains("QCANDLE_DATA"),
        "{msg}"
    );
}

#[test]
fn a_missing_file_names_the_expected_path_and_how_to_get_mnist() {
    let dir = valid_dir();
    std::fs::remove_file(dir.path().join(FILES[3])).unwrap();
    let err = load_from(dir.path()).unwrap_err();
    match &err {
        DataError::MissingFile { dataset, path } => {
            assert_eq!(*dataset, DatasetName::Mnist);
            assert_eq!(*path, dir.path().join(FILES[3]));
        }
        e => panic!("expected MissingFile, got {e:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("t10k-labels-idx1-ubyte.gz"), "{msg}");
    assert!(msg.contains("official MNIST"), "{msg}");
}

#[test]
fn mnist_has_no_default_directory_and_asks_for_data_dir_or_env() {
    let err = resolve_dir(DatasetName::Mnist, None, None).unwrap_err();
    assert!(matches!(err, DataError::NoDirectory { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("--data-dir") && msg.contains("QCANDLE_DATA"),
        "{msg}"
    );
}

#[test]
fn directory_resolution_prefers_explicit_then_env_then_default() {
    let fm = DatasetName::FashionMnist;
    let explicit = Path::new("/a");
    assert_eq!(
        resolve_dir(fm, Some(explicit), Some("/b".into())).unwrap(),
        explicit
    );
    assert_eq!(
        resolve_dir(fm, None, Some("/b".into())).unwrap(),
        Path::new("/b")
    );
    assert_eq!(
        resolve_dir(fm, None, None).unwrap(),
        Path::new("/usr/share/datasets/fashion-mnist")
    );
    // An empty variable counts as unset.
    assert_eq!(
        resolve_dir(fm, None, Some("".into())).unwrap(),
        Path::new("/usr/share/datasets/fashion-mnist")
    );
    assert_eq!(
        resolve_dir(DatasetName::Mnist, None, Some("/b".into())).unwrap(),
        Path::new("/b")
    );
}

#[test]
fn dataset_names_parse_and_display_round_trip_and_unknown_names_are_errors() {
    for name in DatasetName::ALL {
        assert_eq!(name.to_string().parse::<DatasetName>().unwrap(), name);
    }
    assert_eq!(
        "fashion-mnist".parse::<DatasetName>().unwrap(),
        DatasetName::FashionMnist
    );
    assert_eq!("mnist".parse::<DatasetName>().unwrap(), DatasetName::Mnist);
    let err = "cifar10".parse::<DatasetName>().unwrap_err();
    assert!(matches!(err, DataError::UnknownName { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("cifar10") && msg.contains("fashion-mnist"),
        "{msg}"
    );
}

#[test]
fn data_errors_convert_to_candle_errors_keeping_the_message() {
    let err = "cifar10".parse::<DatasetName>().unwrap_err();
    let msg = err.to_string();
    let candle: candle_core::Error = err.into();
    assert_eq!(candle.to_string(), msg);
}

// ---- Batching ----

/// A dataset whose item `i` has label `i` and every pixel equal to `i`.
fn indexed(n: usize) -> Dataset {
    let dev = Device::Cpu;
    let ids: Vec<u32> = (0..n as u32).collect();
    let labels = Tensor::from_vec(ids, n, &dev).unwrap();
    let images = labels
        .to_dtype(DType::F32)
        .unwrap()
        .reshape((n, 1, 1, 1))
        .unwrap()
        .broadcast_as((n, 1, 28, 28))
        .unwrap()
        .contiguous()
        .unwrap();
    Dataset {
        name: DatasetName::Mnist,
        train_images: images.clone(),
        train_labels: labels.clone(),
        test_images: images,
        test_labels: labels,
        source: "test".into(),
    }
}

fn epoch_order(ds: &Dataset, batch: usize, epoch: usize, seed: u64) -> Vec<u32> {
    let mut order = Vec::new();
    for b in ds.train_batches(batch, epoch, seed).unwrap() {
        let (x, y) = b.unwrap();
        let y = labels(&y);
        // Images travel with their labels.
        let x: Vec<f32> = x
            .mean_keepdim((1, 2, 3))
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(x, y.iter().map(|&l| l as f32).collect::<Vec<_>>());
        order.extend(y);
    }
    order
}

#[test]
fn an_epoch_visits_every_training_item_exactly_once_in_permutation_order() {
    let ds = indexed(1000);
    let order = epoch_order(&ds, 64, 3, 42);
    assert_eq!(order, permutation(1000, 42, 3));
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..1000).collect::<Vec<u32>>());
    assert_ne!(order, sorted, "the order is shuffled");
}

#[test]
fn the_shuffle_is_reproducible_for_a_seed_and_differs_across_epochs_and_seeds() {
    let ds = indexed(500);
    let a = epoch_order(&ds, 50, 0, 7);
    assert_eq!(a, epoch_order(&ds, 50, 0, 7));
    assert_eq!(
        a,
        epoch_order(&ds, 33, 0, 7),
        "independent of the batch size"
    );
    assert_ne!(a, epoch_order(&ds, 50, 1, 7));
    assert_ne!(a, epoch_order(&ds, 50, 0, 8));
}

#[test]
fn every_item_is_equally_likely_at_every_position() {
    // 4 items over 24000 epochs: each (item, position) count is 6000 on average, with a
    // standard deviation of about 67. An off-by-one in the draw range (Sattolo's cycles
    // instead of Fisher-Yates) never leaves an item in place and fails this.
    let (n, epochs) = (4usize, 24000usize);
    let mut counts = vec![[0usize; 4]; n];
    for e in 0..epochs {
        for (pos, &item) in permutation(n, 11, e).iter().enumerate() {
            counts[item as usize][pos] += 1;
        }
    }
    let mean = (epochs / n) as f64;
    for row in &counts {
        for &c in row {
            assert!((c as f64 - mean).abs() < 6.0 * 67.0, "{counts:?}");
        }
    }
}

#[test]
fn the_last_partial_batch_is_kept() {
    let ds = indexed(10);
    let sizes: Vec<usize> = ds
        .train_batches(4, 0, 1)
        .unwrap()
        .map(|b| b.unwrap().1.dims()[0])
        .collect();
    assert_eq!(sizes, [4, 4, 2]);
    assert_eq!(ds.train_batches(4, 0, 1).unwrap().len(), 3);
    assert_eq!(ds.train_batches(5, 0, 1).unwrap().len(), 2);
}

#[test]
fn test_batches_are_in_stored_order_with_the_last_partial_batch() {
    let ds = indexed(10);
    let batches: Vec<Vec<u32>> = ds
        .test_batches(3)
        .unwrap()
        .map(|b| labels(&b.unwrap().1))
        .collect();
    assert_eq!(
        batches,
        [vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8], vec![9]]
    );
}

#[test]
fn a_zero_batch_size_is_an_error() {
    let ds = indexed(10);
    assert!(matches!(
        ds.train_batches(0, 0, 1),
        Err(DataError::ZeroBatch)
    ));
    assert!(matches!(ds.test_batches(0), Err(DataError::ZeroBatch)));
}

#[test]
fn subset_keeps_the_first_items_and_clamps_to_the_available_count() {
    let ds = indexed(10);
    let s = ds.subset(4, 20).unwrap();
    assert_eq!(labels(&s.train_labels), [0, 1, 2, 3]);
    assert_eq!(s.train_images.dims(), [4, 1, 28, 28]);
    assert_eq!(s.test_len(), 10);
    assert_eq!(s.train_len(), 4);
}
