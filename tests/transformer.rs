//! The transformer and lenet5-classic of the zoo, and the modular-addition dataset: shapes,
//! names, refusals, and short training runs that learn.

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{VarBuilder, VarMap};
use qcandle::data::modadd::{modadd, MODADD_P, TRAIN_PERCENT};
use qcandle::data::{DataSource, Dataset};
use qcandle::nn::{ModelKind, QConfig};
use qcandle::train::{train, OptimizerKind, TrainOptions};

type R = anyhow::Result<()>;

fn options(model: &str, epochs: usize, lr: f64, batch: usize) -> TrainOptions {
    TrainOptions {
        model: model.into(),
        config_name: "float32".into(),
        epochs,
        batch,
        lr,
        optimizer: OptimizerKind::Adam,
        seed: 1,
        train_limit: None,
        device: qcandle::device::DeviceSpec::Cpu,
    }
}

/// The modadd dataset with other labels: `label(a, b)`.
fn relabel(data: &Dataset, label: impl Fn(u32, u32) -> u32) -> anyhow::Result<Dataset> {
    let labels = |images: &Tensor| -> anyhow::Result<Tensor> {
        let rows = images.flatten_from(1)?.to_vec2::<f32>()?;
        let v: Vec<u32> = rows
            .iter()
            .map(|r| label(r[0] as u32, r[1] as u32))
            .collect();
        Ok(Tensor::new(v, &Device::Cpu)?)
    };
    Ok(Dataset {
        train_labels: labels(&data.train_images)?,
        test_labels: labels(&data.test_images)?,
        ..data.clone()
    })
}

#[test]
fn modadd_holds_every_pair_once_with_its_sum_and_a_fixed_split() -> R {
    let data = modadd(MODADD_P)?;
    let n = MODADD_P * MODADD_P;
    assert_eq!(data.train_len(), n * TRAIN_PERCENT / 100);
    assert_eq!(data.train_len() + data.test_len(), n);
    let mut seen = vec![false; n];
    for (images, labels) in [
        (&data.train_images, &data.train_labels),
        (&data.test_images, &data.test_labels),
    ] {
        assert_eq!(&images.dims()[1..], &[1, 1, 3]);
        let rows = images.flatten_from(1)?.to_vec2::<f32>()?;
        for (row, label) in rows.iter().zip(labels.to_vec1::<u32>()?) {
            let (a, b) = (row[0] as usize, row[1] as usize);
            assert_eq!(row[2] as usize, MODADD_P, "the third token is `=`");
            assert_eq!(label as usize, (a + b) % MODADD_P);
            assert!(!seen[a * MODADD_P + b], "({a}, {b}) twice");
            seen[a * MODADD_P + b] = true;
        }
    }
    assert!(seen.iter().all(|&s| s));
    // The split is a function of nothing but the modulus.
    let again = modadd(MODADD_P)?;
    assert_eq!(
        again.test_images.flatten_all()?.to_vec1::<f32>()?,
        data.test_images.flatten_all()?.to_vec1::<f32>()?
    );
    assert!(modadd(1).is_err() && modadd(MODADD_P + 1).is_err());
    let source: DataSource = "modadd".parse()?;
    assert_eq!(source.to_string(), "modadd");
    let e = source.load(Some(std::path::Path::new("/tmp"))).unwrap_err();
    assert!(e.to_string().contains("reads no files"), "{e}");
    Ok(())
}

#[test]
fn the_transformer_gives_logits_per_sequence_and_refuses_bad_tokens() -> R {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let model = ModelKind::Transformer.build(vb, &QConfig::load("posit<8,1>")?)?;
    let data = modadd(MODADD_P)?.subset(5, 5)?;
    let logits = model.forward(&data.train_images)?;
    assert_eq!(logits.dims(), &[5, MODADD_P]);
    assert!(logits
        .flatten_all()?
        .to_vec1::<f32>()?
        .iter()
        .all(|x| x.is_finite()));
    let bad = Tensor::new(&[[1.5f32, 2.0, 97.0]], &Device::Cpu)?.reshape((1, 1, 1, 3))?;
    let e = model.forward(&bad).unwrap_err().to_string();
    assert!(e.contains("whole numbers"), "{e}");
    let bad = Tensor::new(&[[1f32, 2.0, 98.0]], &Device::Cpu)?.reshape((1, 1, 1, 3))?;
    assert!(
        model.forward(&bad).is_err(),
        "token 98 is outside the vocabulary"
    );
    let images = Tensor::zeros((1, 1, 28, 28), DType::F32, &Device::Cpu)?;
    assert!(model.forward(&images).is_err(), "images are refused");
    Ok(())
}

#[test]
fn the_transformer_learns_to_route_a_token_to_the_last_position() -> R {
    // The answer is the first token: attention must carry it to the `=` position.
    let data = relabel(&modadd(MODADD_P)?, |a, _| a)?;
    let data = data.subset(2000, 500)?;
    let epochs = train(
        &data,
        &options("transformer", 3, 3e-3, 32),
        &QConfig::float32(),
        None,
        true,
    )?;
    let last = epochs.last().unwrap();
    assert!(
        last.top1 > 50.0,
        "top-1 {} after {} epochs",
        last.top1,
        epochs.len()
    );
    Ok(())
}
