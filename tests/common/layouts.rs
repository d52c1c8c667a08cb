//! A GEMM's f32 operands in every stored layout the f32 entries read (each of `A` and `B`
//! as it is or as its transpose), and pools of a given size for the paths that split by
//! threads.

use qcandle::quire::quire_i16::Operand;

/// `v` (`rows x cols`, row-major) transposed (`cols x rows`).
pub fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols)
        .map(|o| v[(o % rows) * cols + o / rows])
        .collect()
}

/// `A` (`m x k`) and `B` (`k x n`), each also transposed.
pub struct Layouts {
    a: Vec<f32>,
    at: Vec<f32>,
    b: Vec<f32>,
    bt: Vec<f32>,
}

impl Layouts {
    /// The layouts of `a` (`m x k`, row-major) and `b` (`k x n`).
    pub fn new(a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize)) -> Self {
        Layouts {
            a: a.to_vec(),
            at: transpose(a, m, k),
            b: b.to_vec(),
            bt: transpose(b, k, n),
        }
    }

    /// `((A transposed, B transposed), A, B)` for each of the four layouts.
    pub fn each(&self) -> impl Iterator<Item = ((bool, bool), Operand<'_>, Operand<'_>)> {
        [(false, false), (true, false), (false, true), (true, true)]
            .into_iter()
            .map(move |(ta, tb)| {
                let a = Operand {
                    data: if ta { &self.at } else { &self.a },
                    transposed: ta,
                };
                let b = Operand {
                    data: if tb { &self.bt } else { &self.b },
                    transposed: tb,
                };
                ((ta, tb), a, b)
            })
    }
}

/// A rayon pool of `threads` threads: the parallel paths split as on a machine with that
/// many, whatever this one has.
#[allow(dead_code)] // each test file uses part of it
pub fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool")
}
