//! A workload's `[[tool]]` tables checked (docs/design.md 3.4): names, descriptions, the
//! parameter schemas (an object schema whose properties the result template and
//! `values` may name) and the values each argument is drawn from.

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;

use toml::Spanned;

use super::{RawTool, RawWorkload};
use crate::config::{ConfigError, Source};
use crate::core::workload::{placeholders, ToolSpec};

/// Every `[[tool]]` table, at least one, names distinct.
pub(super) fn validate_tools(
    src: &Source,
    raw: &RawWorkload,
) -> Result<Vec<ToolSpec>, ConfigError> {
    if raw.tool.is_empty() {
        return Err(src.invalid(
            raw.task.span(),
            "the workload offers no tools: every step is a tool call",
            "add at least one [[tool]] table (see workloads/agentic.toml)",
        ));
    }
    let mut seen = HashSet::new();
    let mut tools = Vec::with_capacity(raw.tool.len());
    for raw_tool in &raw.tool {
        let tool = validate_tool(src, raw_tool)?;
        if !seen.insert(tool.name.clone()) {
            return Err(src.invalid(
                raw_tool.get_ref().name.span(),
                format!("tool {} is defined twice", tool.name),
                "give every [[tool]] a distinct name",
            ));
        }
        tools.push(tool);
    }
    Ok(tools)
}

const SCHEMA_FIX: &str = "write an object schema: type = \"object\" and one [tool.parameters.properties.NAME] table per argument";

fn validate_tool(src: &Source, raw: &Spanned<RawTool>) -> Result<ToolSpec, ConfigError> {
    let t = raw.get_ref();
    let name = t.name.get_ref().trim().to_string();
    let valid_name = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid_name {
        return Err(src.invalid(
            t.name.span(),
            format!("tool name {name:?} is not a function name"),
            "use letters, digits, _ and - (at most 64 characters), e.g. read_file",
        ));
    }
    let check = ToolCheck {
        src,
        tool: t,
        name: &name,
    };
    let (parameters, whole) = check.parameters()?;
    let properties = parameters["properties"]
        .as_object()
        .expect("parameters() checked the properties");
    let values_span = t
        .values
        .as_ref()
        .map(|v| v.span())
        .unwrap_or_else(|| raw.span());
    let arg_values = check.value_pools(properties, values_span)?;
    check.sample_passes(&whole, &arg_values)?;
    check.result_placeholders(properties)?;
    Ok(ToolSpec {
        name,
        description: t.description.trim().to_string(),
        parameters,
        arg_values,
        result: t.result.get_ref().clone(),
    })
}

/// The checks of one `[[tool]]` table after its name: schema, value pools, result template.
struct ToolCheck<'a> {
    src: &'a Source<'a>,
    tool: &'a RawTool,
    name: &'a str,
}

type Properties = serde_json::Map<String, serde_json::Value>;

impl ToolCheck<'_> {
    fn invalid(&self, span: Range<usize>, message: String, fix: impl Into<String>) -> ConfigError {
        self.src
            .invalid(span, format!("tool {}: {message}", self.name), fix)
    }

    /// The parameters as JSON: a valid object schema with at least one property, and
    /// its compiled validator.
    fn parameters(&self) -> Result<(serde_json::Value, jsonschema::Validator), ConfigError> {
        let span = self.tool.parameters.span();
        let parameters = serde_json::to_value(self.tool.parameters.get_ref()).map_err(|e| {
            self.invalid(
                span.clone(),
                format!("parameters cannot be expressed as JSON: {e}"),
                "write the schema with strings, numbers, booleans, arrays and tables only",
            )
        })?;
        if parameters.get("type").and_then(|v| v.as_str()) != Some("object") {
            return Err(self.invalid(
                span,
                "parameters must be a JSON schema with type = \"object\"".into(),
                SCHEMA_FIX,
            ));
        }
        if parameters
            .get("properties")
            .and_then(|p| p.as_object())
            .is_none_or(|p| p.is_empty())
        {
            return Err(self.invalid(
                span,
                "parameters has no properties (every step passes arguments)".into(),
                SCHEMA_FIX,
            ));
        }
        if let Err(e) = jsonschema::meta::validate(&parameters) {
            return Err(self.invalid(
                span,
                format!("parameters is not a valid JSON schema: {e}"),
                SCHEMA_FIX,
            ));
        }
        let whole = jsonschema::validator_for(&parameters).map_err(|e| {
            self.invalid(
                span,
                format!("parameters cannot be compiled as a JSON schema: {e}"),
                SCHEMA_FIX,
            )
        })?;
        Ok((parameters, whole))
    }

    /// `[tool.values]`: one non-empty pool per property (and none for anything else),
    /// every value valid under its property's schema.
    fn value_pools(
        &self,
        properties: &Properties,
        values_span: Range<usize>,
    ) -> Result<BTreeMap<String, Vec<serde_json::Value>>, ConfigError> {
        let empty = BTreeMap::new();
        let pools = self
            .tool
            .values
            .as_ref()
            .map(|v| v.get_ref())
            .unwrap_or(&empty);
        for (key, pool) in pools {
            if !properties.contains_key(key) {
                return Err(self.invalid(
                    pool.span(),
                    format!("value pool `{key}` is not a property of its parameters"),
                    format!(
                        "remove it or add [tool.parameters.properties.{key}]; properties: {}",
                        property_list(properties)
                    ),
                ));
            }
        }
        let mut arg_values = BTreeMap::new();
        for (prop, prop_schema) in properties {
            let Some(pool) = pools.get(prop) else {
                return Err(self.invalid(
                    values_span,
                    format!("no value pool for argument `{prop}`"),
                    format!("add `{prop} = [...]` under [tool.values] with the values the task generator may use"),
                ));
            };
            arg_values.insert(prop.clone(), self.pool(prop, prop_schema, pool)?);
        }
        Ok(arg_values)
    }

    /// One property's pool as JSON values, each valid under the property's schema.
    fn pool(
        &self,
        prop: &str,
        prop_schema: &serde_json::Value,
        pool: &Spanned<Vec<toml::Value>>,
    ) -> Result<Vec<serde_json::Value>, ConfigError> {
        if pool.get_ref().is_empty() {
            return Err(self.invalid(
                pool.span(),
                format!("the value pool for `{prop}` is empty"),
                format!("list at least one value for `{prop}`"),
            ));
        }
        let validator = jsonschema::validator_for(prop_schema).map_err(|e| {
            self.invalid(
                self.tool.parameters.span(),
                format!("schema of `{prop}` cannot be compiled: {e}"),
                SCHEMA_FIX,
            )
        })?;
        let mut json_pool = Vec::with_capacity(pool.get_ref().len());
        for v in pool.get_ref() {
            let jv = serde_json::to_value(v).map_err(|e| {
                self.invalid(
                    pool.span(),
                    format!("`{prop}` value {v} is not JSON: {e}"),
                    "use strings, numbers or booleans",
                )
            })?;
            if !validator.is_valid(&jv) {
                return Err(self.invalid(
                    pool.span(),
                    format!("value {jv} for `{prop}` does not match its schema {prop_schema}"),
                    format!("change the value or the schema of `{prop}` so every pool value is a valid argument"),
                ));
            }
            json_pool.push(jv);
        }
        Ok(json_pool)
    }

    /// A generated call uses one value from every pool; check that such an object passes
    /// the whole schema (required, additionalProperties, ...), not just each property.
    fn sample_passes(
        &self,
        whole: &jsonschema::Validator,
        arg_values: &BTreeMap<String, Vec<serde_json::Value>>,
    ) -> Result<(), ConfigError> {
        let sample: serde_json::Map<String, serde_json::Value> = arg_values
            .iter()
            .map(|(k, v)| (k.clone(), v[0].clone()))
            .collect();
        let sample = serde_json::Value::Object(sample);
        if let Some(err) = whole.iter_errors(&sample).next() {
            return Err(self.invalid(
                self.tool.parameters.span(),
                format!("generated arguments {sample} fail the parameters schema: {err}"),
                "make the schema accept one value of every pool (check `required` and additionalProperties)",
            ));
        }
        Ok(())
    }

    /// The result template's placeholders: `{tool}`, `{args}` or an argument name.
    fn result_placeholders(&self, properties: &Properties) -> Result<(), ConfigError> {
        for (_, placeholder) in placeholders(self.tool.result.get_ref()) {
            if placeholder != "tool"
                && placeholder != "args"
                && !properties.contains_key(placeholder)
            {
                return Err(self.invalid(
                    self.tool.result.span(),
                    format!("result template uses {{{placeholder}}}, which is not an argument"),
                    format!(
                        "use {{tool}}, {{args}} or an argument name: {}",
                        property_list(properties)
                    ),
                ));
            }
        }
        Ok(())
    }
}

fn property_list(properties: &Properties) -> String {
    properties.keys().cloned().collect::<Vec<_>>().join(", ")
}
