//! `qcandle::plot::training_curves`: a PNG of the documented size for one and several series,
//! with its text drawn (title and legend), no error for a single point, empty, all-equal or
//! non-finite data, an error (not a panic) for an unwritable path, and no temporary file left
//! behind.

use std::path::{Path, PathBuf};

use qcandle::plot::{training_curves, Series, HEIGHT, WIDTH};

/// A decoded picture: width, height and RGB(A) rows.
struct Picture {
    width: usize,
    height: usize,
    channels: usize,
    pixels: Vec<u8>,
}

impl Picture {
    fn read(path: &Path) -> Picture {
        let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
        let mut reader = decoder.read_info().unwrap();
        let mut pixels = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut pixels).unwrap();
        assert_eq!(info.bit_depth, png::BitDepth::Eight);
        Picture {
            width: info.width as usize,
            height: info.height as usize,
            channels: info.color_type.samples(),
            pixels,
        }
    }

    /// Pixels in `x0..x1` x `y0..y1` that are dark grey or black (text and axes; the lines
    /// are coloured and the grid light).
    fn dark_in(&self, (x0, x1): (usize, usize), (y0, y1): (usize, usize)) -> usize {
        let mut n = 0;
        for y in y0..y1.min(self.height) {
            for x in x0..x1.min(self.width) {
                let i = (y * self.width + x) * self.channels;
                let [r, g, b] = [self.pixels[i], self.pixels[i + 1], self.pixels[i + 2]];
                let grey = r.abs_diff(g) < 16 && g.abs_diff(b) < 16;
                if grey && (r as u32 + g as u32 + b as u32) < 3 * 128 {
                    n += 1;
                }
            }
        }
        n
    }

    fn dark(&self) -> usize {
        self.dark_in((0, self.width), (0, self.height))
    }

    fn non_white(&self) -> usize {
        self.pixels
            .chunks(self.channels)
            .filter(|p| p[..3] != [255, 255, 255])
            .count()
    }
}

/// Width and height from a PNG file's signature and IHDR chunk.
fn png_size(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap();
    assert!(
        bytes.len() > 33,
        "{} is too short for a PNG",
        path.display()
    );
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    assert_eq!(&bytes[12..16], b"IHDR", "the first chunk is IHDR");
    let be = |i: usize| u32::from_be_bytes(bytes[i..i + 4].try_into().unwrap());
    (be(16), be(20))
}

/// The files in `dir` (to see that no temporary file is left).
fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

fn loss_curve(label: &str, scale: f64) -> Series {
    Series::new(
        label,
        (1..=20)
            .map(|e| (e as f64, scale * 2.3 / (e as f64).sqrt()))
            .collect(),
    )
}

fn accuracy_curve(label: &str, top: f64) -> Series {
    Series::new(
        label,
        (1..=20)
            .map(|e| (e as f64, top * (1.0 - (-(e as f64) / 4.0).exp())))
            .collect(),
    )
}

#[test]
fn one_series_gives_a_png_of_the_documented_size_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("curves.png");
    training_curves(
        "mlp, posit<8,0>",
        &[loss_curve("posit<8,0>", 1.0)],
        &[accuracy_curve("posit<8,0>", 97.0)],
        &out,
    )
    .unwrap();
    assert_eq!(png_size(&out), (WIDTH, HEIGHT));
    assert_eq!(
        files_in(dir.path()),
        vec![out.clone()],
        "no temporary file left"
    );
    let pic = Picture::read(&out);
    assert_eq!((pic.width, pic.height), (WIDTH as usize, HEIGHT as usize));
    // Axes, text and lines, on a mostly white background.
    let non_white = pic.non_white();
    let total = pic.width * pic.height;
    assert!(
        non_white > total / 100 && non_white < total / 2,
        "{non_white} of {total} pixels drawn"
    );
}

#[test]
fn several_series_give_a_png_of_the_documented_size() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("compare.png");
    let formats = [
        "f32",
        "bf16",
        "e4m3",
        "posit<8,0>",
        "posit<16,1>",
        "fixed<8,4>",
    ];
    let loss: Vec<Series> = formats
        .iter()
        .enumerate()
        .map(|(i, f)| loss_curve(f, 1.0 + i as f64 * 0.1))
        .collect();
    let acc: Vec<Series> = formats
        .iter()
        .enumerate()
        .map(|(i, f)| accuracy_curve(f, 98.0 - i as f64))
        .collect();
    training_curves("format comparison", &loss, &acc, &out).unwrap();
    assert_eq!(png_size(&out), (WIDTH, HEIGHT));
    assert_eq!(files_in(dir.path()), vec![out]);
}

#[test]
fn the_title_is_drawn_as_text_across_the_top() {
    let dir = tempfile::tempdir().unwrap();
    let (with, without) = (dir.path().join("with.png"), dir.path().join("without.png"));
    let (loss, acc) = ([loss_curve("a", 1.0)], [accuracy_curve("a", 90.0)]);
    training_curves("Training curves TITLE", &loss, &acc, &with).unwrap();
    training_curves("", &loss, &acc, &without).unwrap();
    // The title is centred over the gap between the two panels, where nothing else is.
    let band = ((WIDTH as usize / 2 - 60, WIDTH as usize / 2 + 60), (0, 30));
    let (a, b) = (
        Picture::read(&with).dark_in(band.0, band.1),
        Picture::read(&without).dark_in(band.0, band.1),
    );
    assert!(a > 50, "only {a} dark pixels where the title is");
    assert_eq!(b, 0, "dark pixels above the panels without a title");
}

#[test]
fn legend_labels_are_drawn_as_text() {
    let dir = tempfile::tempdir().unwrap();
    let (with, without) = (dir.path().join("with.png"), dir.path().join("without.png"));
    let labelled = |l: &str| ([loss_curve(l, 1.0)], [accuracy_curve(l, 90.0)]);
    let (loss, acc) = labelled("posit<8,0> stochastic rounding");
    training_curves("t", &loss, &acc, &with).unwrap();
    let (loss, acc) = labelled("");
    training_curves("t", &loss, &acc, &without).unwrap();
    let (a, b) = (Picture::read(&with).dark(), Picture::read(&without).dark());
    assert!(
        a > b + 200,
        "labels add only {} dark pixels",
        a as i64 - b as i64
    );
}

#[test]
fn a_single_point_empty_series_and_equal_values_are_drawn_without_error() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Vec<Series>, Vec<Series>)> = vec![
        (
            "single",
            vec![Series::new("one epoch", vec![(1.0, 0.7)])],
            vec![Series::new("one epoch", vec![(1.0, 81.5)])],
        ),
        ("no series", vec![], vec![]),
        (
            "empty series",
            vec![Series::new("nothing yet", vec![])],
            vec![Series::default()],
        ),
        (
            "equal",
            vec![Series::new(
                "flat",
                vec![(1.0, 0.5), (2.0, 0.5), (3.0, 0.5)],
            )],
            vec![Series::new("zero", vec![(1.0, 0.0), (1.0, 0.0)])],
        ),
    ];
    for (name, loss, acc) in cases {
        let out = dir.path().join(format!("{name}.png"));
        training_curves(name, &loss, &acc, &out).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert_eq!(png_size(&out), (WIDTH, HEIGHT), "{name}");
    }
}

#[test]
fn nan_and_infinite_points_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("diverged.png");
    let (nan, inf) = (f64::NAN, f64::INFINITY);
    let loss = [
        Series::new(
            "diverges",
            vec![(1.0, 2.0), (2.0, 1.5), (3.0, inf), (4.0, nan), (5.0, 1.2)],
        ),
        Series::new("all nan", vec![(1.0, nan), (nan, 1.0), (-inf, inf)]),
    ];
    let acc = [Series::new(
        "diverges",
        vec![(1.0, 40.0), (2.0, nan), (3.0, 10.0)],
    )];
    training_curves("nan", &loss, &acc, &out).unwrap();
    assert_eq!(png_size(&out), (WIDTH, HEIGHT));
    let all_nan = [Series::new("nan", vec![(1.0, nan)])];
    training_curves("only nan", &all_nan, &all_nan, &out).unwrap();
    assert_eq!(png_size(&out), (WIDTH, HEIGHT));
}

#[test]
fn missing_directories_are_created_like_other_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("runs/mlp/curves.png");
    training_curves("t", &[loss_curve("a", 1.0)], &[], &out).unwrap();
    assert_eq!(png_size(&out), (WIDTH, HEIGHT));
}

#[test]
fn an_unwritable_path_is_an_error_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    // A regular file where the directory should be.
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, b"x").unwrap();
    let out = blocker.join("curves.png");
    let err = training_curves("t", &[loss_curve("a", 1.0)], &[], &out).unwrap_err();
    assert!(
        format!("{err:#}").contains("not-a-dir"),
        "the error names the path: {err:#}"
    );
    // A directory where the file should be: drawing succeeds, the rename fails.
    let taken = dir.path().join("taken.png");
    std::fs::create_dir(&taken).unwrap();
    assert!(training_curves("t", &[loss_curve("a", 1.0)], &[], &taken).is_err());
    assert_eq!(
        files_in(dir.path()),
        vec![blocker, taken],
        "no temporary file left behind after a failure"
    );
}

#[test]
fn rewriting_replaces_the_picture() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("curves.png");
    training_curves("first", &[loss_curve("a", 1.0)], &[], &out).unwrap();
    let first = std::fs::read(&out).unwrap();
    training_curves("second", &[loss_curve("b", 3.0)], &[], &out).unwrap();
    assert_ne!(std::fs::read(&out).unwrap(), first);
    assert_eq!(files_in(dir.path()), vec![out]);
}

/// The count of pixels of exactly `colour` (RGB).
fn count_colour(p: &Picture, colour: [u8; 3]) -> usize {
    p.pixels
        .chunks(p.channels)
        .filter(|px| px[..3] == colour)
        .count()
}

fn grid(rows: usize, columns: usize, values: Vec<Vec<Option<f64>>>) -> qcandle::plot::Grid {
    qcandle::plot::Grid {
        title: "t".into(),
        row_desc: "category".into(),
        column_desc: "format".into(),
        rows: (0..rows).map(|r| format!("r{r}")).collect(),
        columns: (0..columns).map(|c| format!("c{c}")).collect(),
        values,
    }
}

#[test]
fn a_heatmap_draws_one_cell_per_value_in_its_shade() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.png");
    // The smallest value is drawn lightest (255, 247, 188), the largest darkest (8, 48, 107),
    // a missing one grey (220, 220, 220); each of the six cells has the same area.
    let values = vec![
        vec![Some(10.0), Some(50.0), None],
        vec![Some(90.0), Some(f64::NAN), Some(50.0)],
    ];
    qcandle::plot::heatmap(&grid(2, 3, values), &path).unwrap();
    let p = Picture::read(&path);
    assert_eq!((p.width, p.height), (900, 650));
    let light = count_colour(&p, [255, 247, 188]);
    let dark = count_colour(&p, [8, 48, 107]);
    let grey = count_colour(&p, [220, 220, 220]);
    // Text inside the cells takes a few pixels; the cells are otherwise equal in area.
    assert!(light > 20_000, "{light}");
    let near = |a: usize, b: usize| (a as f64 / b as f64 - 1.0).abs() < 0.1;
    assert!(near(dark, light), "dark {dark}, light {light}");
    // Two blank cells (None and NaN) are grey, unlabelled: twice a labelled cell's area.
    assert!(near(grey, 2 * light), "grey {grey}, light {light}");
    // A single cell is a valid heatmap too.
    qcandle::plot::heatmap(&grid(1, 1, vec![vec![Some(1.0)]]), &path).unwrap();
    assert_eq!(png_size(&path), (900, 650));
}

#[test]
fn a_heatmap_whose_values_do_not_fit_its_labels_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.png");
    let e = qcandle::plot::heatmap(&grid(2, 2, vec![vec![Some(1.0)]]), &path).unwrap_err();
    assert!(
        e.to_string().contains("one value per row and column"),
        "{e}"
    );
    assert!(!path.exists());
}
