//! The spend ledger: what every finished call used and cost, added in the transaction that
//! finishes it to one row per hour, tenant, group chain, model and deployment, so the ledger
//! grows with tenants × models × hours and not with calls. Reports read it back summed by
//! tenant, group, model or day, as JSON or CSV.

use crate::model::Usage;
use serde::Serialize;
use std::collections::BTreeMap;

/// One hour's spend of one tenant on one model (and deployment), as the store keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SpendRow {
    /// The hour's start, in epoch milliseconds (UTC).
    pub hour_ms: i64,
    /// The tenant.
    pub tenant: String,
    /// The tenant's group chain when the calls finished, nearest first (empty: no group).
    pub groups: Vec<String>,
    /// The model (empty: none named).
    pub model: String,
    /// The deployment that served the calls (empty: none).
    pub deployment: String,
    /// Calls finished with usage.
    pub calls: u64,
    /// Tokens by class (cached input and cache writes are parts of input, reasoning of
    /// output).
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Input tokens read from the provider's cache.
    pub cached_input_tokens: u64,
    /// Input tokens written to the provider's cache.
    pub cache_write_tokens: u64,
    /// Output tokens spent reasoning.
    pub reasoning_tokens: u64,
    /// What the usage cost at the model's price, in micro-dollars.
    pub cost_microusd: u64,
}

/// One hour in milliseconds.
pub const HOUR_MS: i64 = 3_600_000;
/// One day in milliseconds.
pub const DAY_MS: i64 = 86_400_000;

impl SpendRow {
    /// One call's usage and cost, in the hour of `now_ms`.
    pub fn of_call(
        now_ms: i64,
        tenant: &str,
        groups: &[&str],
        model: Option<&str>,
        deployment: Option<&str>,
        usage: &Usage,
        cost_microusd: u64,
    ) -> SpendRow {
        SpendRow {
            hour_ms: now_ms - now_ms.rem_euclid(HOUR_MS),
            tenant: tenant.to_string(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            model: model.unwrap_or_default().to_string(),
            deployment: deployment.unwrap_or_default().to_string(),
            calls: 1,
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cached_input_tokens: usage.cached_input_tokens,
            cache_write_tokens: usage.cache_write_tokens,
            reasoning_tokens: usage.reasoning_tokens,
            cost_microusd,
        }
    }

    /// The group chain as the store keeps it: a JSON array (group names may hold any
    /// character).
    pub fn groups_text(&self) -> String {
        serde_json::to_string(&self.groups).unwrap_or_else(|_| "[]".into())
    }

    /// The group chain from the store's text (a damaged one reads as no group).
    pub fn groups_from_text(text: &str) -> Vec<String> {
        serde_json::from_str(text).unwrap_or_default()
    }

    /// The row's figures, to be summed.
    pub fn sums(&self) -> Sums {
        Sums {
            calls: self.calls,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            cached_input_tokens: self.cached_input_tokens,
            cache_write_tokens: self.cache_write_tokens,
            reasoning_tokens: self.reasoning_tokens,
            cost_microusd: self.cost_microusd,
        }
    }
}

/// Calls, tokens by class and cost, summed over ledger rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Sums {
    /// Calls finished with usage.
    pub calls: u64,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Input tokens read from the provider's cache.
    pub cached_input_tokens: u64,
    /// Input tokens written to the provider's cache.
    pub cache_write_tokens: u64,
    /// Output tokens spent reasoning.
    pub reasoning_tokens: u64,
    /// Micro-dollars.
    pub cost_microusd: u64,
}

impl Sums {
    fn add(&mut self, other: Sums) {
        self.calls += other.calls;
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cached_input_tokens += other.cached_input_tokens;
        self.cache_write_tokens += other.cache_write_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
        self.cost_microusd += other.cost_microusd;
    }
}

/// What a report sums by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupBy {
    /// Each tenant.
    Tenant,
    /// Each group: a row counts in its tenant's group and in every group above it.
    Group,
    /// Each model.
    Model,
    /// Each UTC day.
    Day,
}

impl GroupBy {
    /// From the query parameter's word.
    pub fn parse(word: &str) -> Option<GroupBy> {
        Some(match word {
            "tenant" => GroupBy::Tenant,
            "group" => GroupBy::Group,
            "model" => GroupBy::Model,
            "day" => GroupBy::Day,
            _ => return None,
        })
    }

    /// The word, as the report's key column is named.
    pub fn as_str(self) -> &'static str {
        match self {
            GroupBy::Tenant => "tenant",
            GroupBy::Group => "group",
            GroupBy::Model => "model",
            GroupBy::Day => "day",
        }
    }
}

/// One line of a report: the key and its sums.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SpendLine {
    /// The tenant, group, model or day (`YYYY-MM-DD`) summed.
    pub key: String,
    /// Its figures.
    #[serde(flatten)]
    pub sums: Sums,
}

/// The ledger's rows summed by `by`, in key order. Rows of tenants with no group count in
/// no group.
pub fn report(rows: &[SpendRow], by: GroupBy) -> Vec<SpendLine> {
    let mut sums: BTreeMap<String, Sums> = BTreeMap::new();
    for row in rows {
        let keys: Vec<String> = match by {
            GroupBy::Tenant => vec![row.tenant.clone()],
            GroupBy::Group => row.groups.clone(),
            GroupBy::Model => vec![row.model.clone()],
            GroupBy::Day => vec![day(row.hour_ms)],
        };
        for key in keys {
            sums.entry(key).or_default().add(row.sums());
        }
    }
    sums.into_iter()
        .map(|(key, sums)| SpendLine { key, sums })
        .collect()
}

/// The UTC day of `ms` as `YYYY-MM-DD`.
fn day(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|d| d.format("%Y-%m-%d").to_string())
        .unwrap_or_default()
}

/// What a spend report asks: the key to sum by and the span of hours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpendQuery {
    /// What to sum by.
    pub group_by: GroupBy,
    /// The first instant counted (epoch ms): hours that start at or after it.
    pub from_ms: i64,
    /// The end (epoch ms, exclusive): hours that start before it.
    pub to_ms: i64,
}

impl SpendQuery {
    /// The query from its words as written (`group_by` `tenant` when none; `from` the start
    /// of this UTC month, `to` now, each an RFC 3339 time, a `YYYY-MM-DD` day or epoch
    /// milliseconds), or what is wrong with them.
    pub fn parse(
        group_by: Option<&str>,
        from: Option<&str>,
        to: Option<&str>,
        now_ms: i64,
    ) -> Result<SpendQuery, String> {
        let group_by = match group_by {
            None => GroupBy::Tenant,
            Some(w) => GroupBy::parse(w).ok_or_else(|| {
                format!("group_by: {w:?} is not one of tenant, group, model, day")
            })?,
        };
        let time = |field: &str, text: Option<&str>, default: i64| {
            match text {
            None => Ok(default),
            Some(t) => parse_time(t).ok_or_else(|| {
                format!("{field}: {t:?} is not an RFC 3339 time, a YYYY-MM-DD day or epoch milliseconds")
            }),
        }
        };
        let from_ms = time("from", from, month_start(now_ms))?;
        let to_ms = time("to", to, now_ms.saturating_add(1))?;
        if to_ms < from_ms {
            return Err("to is before from".into());
        }
        Ok(SpendQuery {
            group_by,
            from_ms,
            to_ms,
        })
    }

    /// The report as JSON: the query, one object per line (its key under the name of what
    /// was summed by) and the total.
    pub fn json(&self, lines: &[SpendLine]) -> serde_json::Value {
        let by = self.group_by.as_str();
        let line = |l: &SpendLine| {
            let mut v = serde_json::to_value(l).unwrap_or_default();
            if let Some(obj) = v.as_object_mut() {
                let key = obj.remove("key").unwrap_or_default();
                obj.insert(by.to_string(), key);
            }
            v
        };
        let mut total = Sums::default();
        for l in lines {
            total.add(l.sums);
        }
        serde_json::json!({
            "group_by": by,
            "from": rfc3339(self.from_ms),
            "to": rfc3339(self.to_ms),
            "rows": lines.iter().map(line).collect::<Vec<_>>(),
            "total": total,
        })
    }
}

/// A time as written: epoch milliseconds, an RFC 3339 time, or a `YYYY-MM-DD` day (its UTC
/// midnight).
pub fn parse_time(text: &str) -> Option<i64> {
    if let Ok(ms) = text.parse::<i64>() {
        return Some(ms);
    }
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
        return Some(t.timestamp_millis());
    }
    let day = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d").ok()?;
    Some(day.and_hms_opt(0, 0, 0)?.and_utc().timestamp_millis())
}

/// The start of the UTC month of `ms`.
fn month_start(ms: i64) -> i64 {
    use chrono::Datelike;
    chrono::DateTime::from_timestamp_millis(ms)
        .and_then(|d| d.date_naive().with_day(1))
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map_or(0, |d| d.and_utc().timestamp_millis())
}

/// `ms` as an RFC 3339 UTC time.
pub fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

/// A report as CSV: a header row (the key column named after `by`), then one row per line.
pub fn csv(lines: &[SpendLine], by: GroupBy) -> String {
    let mut out = format!(
        "{},calls,input_tokens,output_tokens,cached_input_tokens,cache_write_tokens,reasoning_tokens,cost_microusd\r\n",
        by.as_str()
    );
    for SpendLine { key, sums: s } in lines {
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{}\r\n",
            csv_field(key),
            s.calls,
            s.input_tokens,
            s.output_tokens,
            s.cached_input_tokens,
            s.cache_write_tokens,
            s.reasoning_tokens,
            s.cost_microusd
        ));
    }
    out
}

/// A field quoted as RFC 4180 asks when it holds a comma, a quote or a line break.
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(hour_ms: i64, tenant: &str, groups: &[&str], model: &str, cost: u64) -> SpendRow {
        SpendRow::of_call(
            hour_ms,
            tenant,
            groups,
            Some(model),
            None,
            &Usage::new(10, 5),
            cost,
        )
    }

    #[test]
    fn reports_sum_by_each_key_and_groups_count_at_every_level() {
        let rows = vec![
            row(0, "a", &["team", "org"], "m1", 100),
            row(HOUR_MS, "b", &["team", "org"], "m2", 50),
            row(DAY_MS + 5, "c", &[], "m1", 7),
        ];
        let by_group = report(&rows, GroupBy::Group);
        assert_eq!(
            by_group
                .iter()
                .map(|l| (l.key.as_str(), l.sums.cost_microusd))
                .collect::<Vec<_>>(),
            vec![("org", 150), ("team", 150)]
        );
        let by_day = report(&rows, GroupBy::Day);
        assert_eq!(by_day[0].key, "1970-01-01");
        assert_eq!(by_day[0].sums.calls, 2);
        assert_eq!(by_day[1].sums.cost_microusd, 7);
        assert_eq!(rows[2].hour_ms, DAY_MS);
        let by_model = report(&rows, GroupBy::Model);
        assert_eq!(by_model[0].sums.input_tokens, 20);
        let text = csv(&report(&rows, GroupBy::Tenant), GroupBy::Tenant);
        assert!(text.starts_with("tenant,calls,"), "{text}");
        assert_eq!(text.lines().count(), 4);
        assert_eq!(csv_field("a,\"b\""), "\"a,\"\"b\"\"\"");
    }

    #[test]
    fn queries_read_times_in_three_forms_and_refuse_the_rest() {
        let now = parse_time("2027-03-15T10:00:00Z").unwrap();
        let q = SpendQuery::parse(None, None, None, now).unwrap();
        assert_eq!(q.group_by, GroupBy::Tenant);
        assert_eq!(rfc3339(q.from_ms), "2027-03-01T00:00:00.000Z");
        assert_eq!(q.to_ms, now + 1);
        let q =
            SpendQuery::parse(Some("day"), Some("2027-01-01"), Some("1800000000000"), now).unwrap();
        assert_eq!(rfc3339(q.from_ms), "2027-01-01T00:00:00.000Z");
        assert_eq!(q.to_ms, 1_800_000_000_000);
        let e = SpendQuery::parse(Some("week"), None, None, now).unwrap_err();
        assert!(e.contains("group_by"), "{e}");
        let e = SpendQuery::parse(None, Some("yesterday"), None, now).unwrap_err();
        assert!(e.contains("from"), "{e}");
        assert!(SpendQuery::parse(None, Some("2027-02-01"), Some("2027-01-01"), now).is_err());
        let lines = report(&[row(0, "a", &[], "m", 5)], GroupBy::Tenant);
        let by_tenant = SpendQuery::parse(None, None, None, now).unwrap();
        let v = by_tenant.json(&lines);
        assert_eq!(v["rows"][0]["tenant"], "a");
        assert_eq!(v["total"]["cost_microusd"], 5);
    }
}
