//! One answer, three ways to print it: a table for people, JSON or YAML for scripts.

use serde::Serialize;

use crate::{Error, Format};

/// `report` as `format`; `table` draws the table form.
pub fn render<T: Serialize>(report: &T, format: Format, table: fn(&T) -> String) -> Result<String, Error> {
    match format {
        Format::Table => Ok(table(report)),
        Format::Json => serde_json::to_string_pretty(report)
            .map(|text| text + "\n")
            .map_err(Error::OutputJson),
        Format::Yaml => serde_saphyr::to_string(report).map_err(Error::OutputYaml),
    }
}
