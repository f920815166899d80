//! [`KvFlags`]: a model's KV layout as serve's flags ask for it (the command
//! line's `--model`, `--groups`, `--kv-bytes-per-token-layer`,
//! `--capacity-bytes` and `--full-attention-only`, or the Python package's
//! options of the same names), checked once for every front end.

use crate::SimError;

use super::{KvModel, KvSetup, parse_bytes};

/// Serve's model flags, as given (`None`: not given). The byte counts are
/// text, as the command line takes them (`40000000000`, `40G`, `40e9`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvFlags<'a> {
    /// `--model`: a preset's name.
    pub model: Option<&'a str>,
    /// `--groups`: a description of the layers by kind
    /// ([`KvModel::parse_layers`]).
    pub groups: Option<&'a str>,
    /// `--kv-bytes-per-token-layer`, with `--groups`.
    pub kv_bytes_per_token_layer: Option<&'a str>,
    /// `--capacity-bytes`: the KV memory.
    pub capacity_bytes: Option<&'a str>,
    /// `--full-attention-only`.
    pub full_attention_only: bool,
}

impl KvFlags<'_> {
    /// The KV layout these flags ask for, `None` without `--model` or
    /// `--groups`. `sized_by` names the engine's own capacity flag when one
    /// was given (`--capacity-blocks` or `--capacity-tokens`), which a
    /// model's bytes replace.
    ///
    /// ```
    /// use kvbm_sim::KvFlags;
    /// let flags = KvFlags {
    ///     model: Some("gpt-oss-120b"),
    ///     capacity_bytes: Some("40G"),
    ///     ..KvFlags::default()
    /// };
    /// let setup = flags.setup(None)?.expect("a model");
    /// assert_eq!(setup.capacity_bytes, 40_000_000_000);
    /// assert!(flags.setup(Some("--capacity-blocks")).is_err());
    /// assert!(KvFlags::default().setup(None)?.is_none());
    /// # Ok::<(), kvbm_sim::SimError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// - [`SimError::MissingFlag`] for `--capacity-bytes`,
    ///   `--kv-bytes-per-token-layer` or `--full-attention-only` without a
    ///   layout, a layout without `--capacity-bytes`, or `--groups` without
    ///   its bytes per token;
    /// - [`SimError::ConflictingFlags`] for `--model` with `--groups` or
    ///   with `--kv-bytes-per-token-layer`, or a layout with `sized_by`;
    /// - as [`KvModel::preset`], [`KvModel::parse_layers`] and
    ///   [`parse_bytes`] for what they read.
    pub fn setup(&self, sized_by: Option<&'static str>) -> Result<Option<KvSetup>, SimError> {
        let layout = match (self.model, self.groups) {
            (None, None) => {
                let alone = [
                    (self.capacity_bytes.is_some(), "--capacity-bytes"),
                    (
                        self.kv_bytes_per_token_layer.is_some(),
                        "--kv-bytes-per-token-layer",
                    ),
                    (self.full_attention_only, "--full-attention-only"),
                ];
                if let Some((_, flag)) = alone.into_iter().find(|(given, _)| *given) {
                    return Err(SimError::MissingFlag {
                        flag,
                        needs: "--model or --groups (a model's KV layout)",
                    });
                }
                return Ok(None);
            }
            (Some(_), Some(_)) => {
                return Err(SimError::ConflictingFlags {
                    flag: "--model",
                    other: "--groups",
                    reason: "give a preset or a description of layers, not both",
                });
            }
            (Some(_), None) => "--model",
            (None, Some(_)) => "--groups",
        };
        if let Some(other) = sized_by {
            return Err(SimError::ConflictingFlags {
                flag: layout,
                other,
                reason: "a model's pool is sized in bytes (--capacity-bytes)",
            });
        }
        let Some(bytes) = self.capacity_bytes else {
            return Err(SimError::MissingFlag {
                flag: layout,
                needs: "--capacity-bytes (the KV memory in bytes)",
            });
        };
        let capacity_bytes = parse_bytes("--capacity-bytes", bytes)?;
        let model = match (self.model, self.groups, self.kv_bytes_per_token_layer) {
            (Some(_), _, Some(_)) => {
                return Err(SimError::ConflictingFlags {
                    flag: "--kv-bytes-per-token-layer",
                    other: "--model",
                    reason: "a preset has its own bytes per token",
                });
            }
            (Some(name), _, None) => KvModel::preset(name)?,
            (None, Some(_), None) => {
                return Err(SimError::MissingFlag {
                    flag: "--groups",
                    needs: "--kv-bytes-per-token-layer (a token's KV bytes in one layer)",
                });
            }
            (None, Some(spec), Some(bytes)) => {
                let bytes = parse_bytes("--kv-bytes-per-token-layer", bytes)?;
                KvModel::parse_layers(spec, bytes)?
            }
            (None, None, _) => return Ok(None),
        };
        Ok(Some(
            KvSetup::new(model, capacity_bytes).with_full_attention_only(self.full_attention_only),
        ))
    }
}
