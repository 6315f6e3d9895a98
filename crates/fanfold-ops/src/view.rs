//! What a stage sees of a unit: its `project` jq expression applied to the
//! unit's value, or the listed `fields`. The map stage judges evidence
//! against this view, and verify reads evidence back against the same view.

use serde_json::Value;

use crate::jq::{JqProgram, Site, to_val};

#[derive(Debug, thiserror::Error)]
pub enum ProjectError {
    #[error("stage `{stage}` project: {detail}")]
    Compile { stage: String, detail: String },
    #[error("stage `{stage}` project on unit {unit}: {detail}")]
    Eval {
        stage: String,
        unit: String,
        detail: String,
    },
}

/// A stage's view of units, compiled once.
pub struct Projector {
    stage: String,
    fields: Vec<String>,
    program: Option<JqProgram>,
    /// How a runaway evaluation names the expression.
    site: String,
}

impl Projector {
    pub fn compile(
        stage: &str,
        project: Option<&str>,
        fields: &[String],
    ) -> Result<Projector, ProjectError> {
        let program = match project {
            Some(expr) => Some(JqProgram::compile(expr).map_err(|e| ProjectError::Compile {
                stage: stage.to_owned(),
                detail: e.to_string(),
            })?),
            None => None,
        };
        Ok(Projector {
            stage: stage.to_owned(),
            fields: fields.to_vec(),
            program,
            site: format!("the `project` of stage `{stage}`"),
        })
    }

    pub fn project(&self, unit_id: &str, value: &Value) -> Result<Value, ProjectError> {
        let mut view = self.project_value(unit_id, value)?;
        // A unit that is one field of a record keeps saying so in every
        // view of it: its evidence may quote that field only.
        let field = crate::partition::unit_field(value);
        if let (Some(field), Value::Object(shown)) = (field, &mut view) {
            shown.insert(
                crate::partition::UNIT_FIELD.to_owned(),
                Value::String(field.to_owned()),
            );
        }
        Ok(view)
    }

    fn project_value(&self, unit_id: &str, value: &Value) -> Result<Value, ProjectError> {
        let Some(p) = &self.program else {
            return Ok(crate::map::project_fields(&self.fields, value));
        };
        let err = |detail: String| ProjectError::Eval {
            stage: self.stage.clone(),
            unit: unit_id.to_owned(),
            detail,
        };
        match p.first_json(to_val(value), Site::new(&self.site, unit_id)) {
            Ok(Some(v)) => Ok(v),
            Ok(None) => Err(err("the project expression yielded nothing".into())),
            Err(e) => Err(err(e.to_string())),
        }
    }
}

/// The hash bucket of a projected view: what a stage's fact key covers of
/// its unit.
pub const INPUT_BUCKET: fanfold_core::Bucket = fanfold_core::Bucket::Input;
