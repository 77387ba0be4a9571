//! Reads of run attributes: a run's own, and the search by the attribute index
//! (`attributes_search`, migration 6). What a search selects is loops-core's
//! [`RunFilter::matches`]: the SQL only narrows the candidates.

use loops_core::{AttributeValue, Attributes, Error, Result, RunFilter, RunInfo};
use tokio_postgres::Row;

use crate::PgStore;
use crate::read::{column, text};

impl PgStore {
    pub(crate) async fn read_attributes(&self, run_id: &str) -> Result<Attributes> {
        let rows = self
            .rows(
                || format!("reading the attributes of run `{run_id}`"),
                &self.inner.sql.attributes,
                &[&run_id],
            )
            .await?;
        let mut out = Attributes::new();
        for row in &rows {
            let (key, value) = attribute(row, 0, run_id)?;
            out.insert(key, value);
        }
        Ok(out)
    }

    pub(crate) async fn read_search(
        &self,
        filter: &RunFilter,
    ) -> Result<Vec<(RunInfo, Attributes)>> {
        let Some(driving) = filter.driving() else {
            return Ok(Vec::new());
        };
        let (lo, hi) = driving.index_range();
        if lo >= hi {
            return Ok(Vec::new());
        }
        let statuses: Vec<&str> = filter.statuses.iter().map(|s| s.as_str()).collect();
        let rows = self
            .rows(
                || format!("searching runs by attribute `{}`", driving.key),
                &self.inner.sql.search,
                &[&driving.key, &lo, &hi, &statuses, &filter.workflow],
            )
            .await?;
        let mut found: Vec<(RunInfo, Attributes)> = Vec::new();
        for row in &rows {
            let run_id = text(row, 0, "?")?;
            if found.last().is_none_or(|(info, _)| info.run_id != run_id) {
                let info = RunInfo::decode(&run_id, text(row, 1, &run_id)?.as_bytes())?;
                found.push((info, Attributes::new()));
            }
            let (key, value) = attribute(row, 2, &run_id)?;
            if let Some((_, attributes)) = found.last_mut() {
                attributes.insert(key, value);
            }
        }
        found.retain(|(info, attributes)| filter.matches(info, attributes));
        Ok(found)
    }
}

/// The attribute in columns `i` (key) and `i + 1` (index bytes) of `row`.
fn attribute(row: &Row, i: usize, run_id: &str) -> Result<(String, AttributeValue)> {
    let key = text(row, i, run_id)?;
    let bytes: Vec<u8> = row.try_get(i + 1).map_err(|e| column(run_id, e))?;
    let value = AttributeValue::from_index_bytes(&bytes).ok_or_else(|| Error::Database {
        action: format!("reading attribute `{key}` of run `{run_id}`"),
        cause: std::sync::Arc::new(std::io::Error::other(
            "the stored value is not an attribute value (altered outside loops?)",
        )),
    })?;
    Ok((key, value))
}
