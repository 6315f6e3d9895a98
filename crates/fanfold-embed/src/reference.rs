//! The candle forward pass: BERT from candle-transformers over a padded,
//! masked batch. Kept as the f32 reference the native encoder is checked
//! against (tests and `fanfold bench embed-speed`), not used by runs.

use candle_core::{DType, Device, Tensor};
use candle_transformers::models::bert::BertModel;

use crate::EmbedError;

/// Mean pooling over the real tokens of each row, then L2 normalisation.
pub(crate) fn forward(
    model: &BertModel,
    device: &Device,
    rows: &[&[u32]],
) -> Result<Vec<Vec<f32>>, EmbedError> {
    let width = rows.iter().map(|r| r.len()).max().unwrap_or(0).max(1);
    let mut ids = Vec::with_capacity(rows.len() * width);
    let mut mask = Vec::with_capacity(rows.len() * width);
    for r in rows {
        ids.extend_from_slice(r);
        ids.extend(std::iter::repeat_n(0u32, width - r.len()));
        mask.extend(std::iter::repeat_n(1u32, r.len()));
        mask.extend(std::iter::repeat_n(0u32, width - r.len()));
    }
    let shape = (rows.len(), width);
    let ids = Tensor::from_vec(ids, shape, device)?;
    let mask = Tensor::from_vec(mask, shape, device)?;
    let types = ids.zeros_like()?;
    let hidden = model.forward(&ids, &types, Some(&mask))?;
    let mask_f = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
    let summed = hidden.broadcast_mul(&mask_f)?.sum(1)?;
    let counts = mask_f.sum(1)?.clamp(1e-9, f64::MAX)?;
    let mean = summed.broadcast_div(&counts)?;
    let norm = mean.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12, f64::MAX)?;
    Ok(mean.broadcast_div(&norm)?.to_vec2::<f32>()?)
}
