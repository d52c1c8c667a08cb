//! Datasets: MNIST and Fashion-MNIST from their IDX files, and an embedded subset.
