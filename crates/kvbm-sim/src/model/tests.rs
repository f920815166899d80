//! The presets against their configs, vLLM's grouping, and every refusal.

use kvbm_sequence::{AttentionKind, GroupError};

use super::*;

/// `(kind, layers)` of each group.
fn layout(model: &KvModel, block_size: usize) -> Vec<(AttentionKind, usize)> {
    let groups = model.groups(block_size).unwrap();
    groups
        .groups()
        .iter()
        .map(|g| (g.kind(), g.layers()))
        .collect()
}

const FULL: AttentionKind = AttentionKind::Full;

#[test]
fn every_preset_parses_and_validates() {
    for preset in ModelPreset::ALL {
        let model = KvModel::preset(preset.name).unwrap();
        assert_eq!(model.name(), preset.name);
        assert_eq!(model, preset.model());
        let groups = model.groups(16).unwrap();
        // Every layer is in exactly one group; no group exceeds the group size.
        let layers: usize = groups.groups().iter().map(|g| g.layers()).sum();
        assert_eq!(layers, model.total_layers(), "{}", preset.name);
        assert!(
            (groups.groups().iter()).all(|g| g.layers() <= model.layers_per_group()),
            "{}",
            preset.name
        );
        assert_eq!(groups.group(0).unwrap().kind(), FULL, "{}", preset.name);
        let setup = KvSetup::new(model, 40_000_000_000);
        assert!(setup.capacity_blocks(16).unwrap() > 1000, "{}", preset.name);
        // The same layers described on the command line are the same model
        // but for the name.
        let spec: Vec<String> = model.layer_counts().iter().map(|l| describe(*l)).collect();
        let custom = KvModel::parse_layers(&spec.join(","), model.bytes_per_token_layer()).unwrap();
        assert_eq!(layout(&custom, 16), layout(&model, 16));
        assert_eq!(custom.name(), KvModel::CUSTOM_NAME);
    }
    // The error message lists exactly the presets.
    let message = KvModel::preset("gpt-5").unwrap_err().to_string();
    for preset in ModelPreset::ALL {
        assert!(message.contains(preset.name), "{message}");
    }
}

#[test]
fn the_presets_follow_the_published_configs() {
    let bytes = |name: &str| KvModel::preset(name).unwrap().bytes_per_token_layer();
    // 2 × num_key_value_heads × head_dim × 2 bytes (bfloat16).
    assert_eq!(bytes("gpt-oss-120b"), 2 * 8 * 64 * 2);
    assert_eq!(bytes("gpt-oss-20b"), 2 * 8 * 64 * 2);
    assert_eq!(bytes("gemma-3-27b"), 2 * 16 * 128 * 2);
    assert_eq!(bytes("llama-3.1-8b"), 2 * 8 * 128 * 2);
    assert_eq!(bytes("llama-4-scout"), 2 * 8 * 128 * 2);
    let total = |name: &str| KvModel::preset(name).unwrap().total_layers();
    assert_eq!(
        [
            total("gpt-oss-120b"),
            total("gpt-oss-20b"),
            total("gemma-3-27b"),
            total("llama-3.1-8b"),
            total("llama-4-scout")
        ],
        [36, 24, 62, 32, 48]
    );
}

#[test]
fn groups_are_made_as_vllm_makes_them() {
    let sliding = |window| AttentionKind::SlidingWindow { window };
    let gpt = KvModel::preset("gpt-oss-120b").unwrap();
    assert_eq!(layout(&gpt, 16), [(FULL, 18), (sliding(128), 18)]);
    assert_eq!(gpt.layers_per_group(), 18);
    // 16 tokens × 18 layers × 2 KiB.
    assert_eq!(gpt.block_bytes(16).unwrap(), 589_824);

    // Gemma 3: group size 10 (52 ≥ 1.5 × 10); 52 sliding layers in six
    // groups, layer i to group i mod 6: four of 9, two of 8.
    let gemma = KvModel::preset("gemma-3-27b").unwrap();
    assert_eq!(gemma.layers_per_group(), 10);
    let mut expected = vec![(FULL, 10)];
    expected.extend([9, 9, 9, 9, 8, 8].map(|layers| (sliding(1024), layers)));
    assert_eq!(layout(&gemma, 16), expected);

    let scout = KvModel::preset("llama-4-scout").unwrap();
    let chunk = AttentionKind::ChunkedLocal { chunk: 8192 };
    assert_eq!(
        layout(&scout, 16),
        [(FULL, 12), (chunk, 12), (chunk, 12), (chunk, 12)]
    );
    assert_eq!(
        layout(&KvModel::preset("llama-3.1-8b").unwrap(), 16),
        [(FULL, 32)]
    );

    // gpt-oss-20b with an EAGLE drafter's extra full layer (vLLM's own
    // example): 12 sliding, 13 full, under 1.5× apart: groups of 13.
    let eagle = KvModel::parse_layers("sliding_window:128:12,full:13", 2048).unwrap();
    assert_eq!(eagle.layers_per_group(), 13);
    assert_eq!(layout(&eagle, 16), [(FULL, 13), (sliding(128), 12)]);

    // Entries of one kind and span merge, as vLLM buckets layers by spec.
    let merged = KvModel::parse_layers("full:9, full:9,sliding_window:128:18", 2048).unwrap();
    assert_eq!(layout(&merged, 16), layout(&gpt, 16));
}

#[test]
fn full_attention_only_is_one_group_of_every_layer() {
    let gemma = KvModel::preset("gemma-3-27b").unwrap();
    let setup = KvSetup::new(gemma, 40_000_000_000).with_full_attention_only(true);
    assert_eq!(setup.layers_per_block(), 62);
    let groups = setup.groups(16).unwrap();
    assert!(groups.len() == 1 && groups.is_full_attention_only());
    // 16 × 62 × 8 KiB = 8,126,464 bytes a block: 4,922 blocks in 40 GB.
    assert_eq!(setup.block_bytes(16).unwrap(), 8_126_464);
    assert_eq!(setup.capacity_blocks(16).unwrap(), 4922);
    // With groups, a block is 10 layers: 6.2 times as many blocks.
    let grouped = KvSetup::new(gemma, 40_000_000_000);
    assert_eq!(grouped.capacity_blocks(16).unwrap(), 30_517);
}

#[test]
fn bad_descriptions_are_refused_with_the_reason() {
    let reason = |spec: &str| match KvModel::parse_layers(spec, 2048) {
        Err(SimError::InvalidGroupSpec { spec: got, reason }) => {
            assert_eq!(got, spec);
            reason
        }
        other => panic!("{spec}: {other:?}"),
    };
    assert!(reason("").contains("empty entry"));
    assert!(reason("full:18,").contains("empty entry"));
    assert!(reason("full").contains("is not full:LAYERS"));
    assert!(reason("sliding_window:18").contains("is not full:LAYERS"));
    assert!(reason("linear:4").contains("unknown attention kind `linear`"));
    assert!(reason("full:x").contains("layers `x` is not a whole number"));
    assert!(reason("full:-1").contains("not a whole number"));
    assert!(reason("full:0").contains("has no layers"));
    assert!(reason("sliding_window:0:4").contains("spans 0 tokens"));
    assert!(reason("chunked_local:99999999999:4").contains("spans more than"));
    assert!(reason("full:1025").contains("more than 1024 layers"));
    let many: Vec<String> = (1..=9)
        .map(|i| format!("sliding_window:{}:1", i * 16))
        .collect();
    assert!(reason(&many.join(",")).contains("more than 8 kinds"));
    let message = KvModel::parse_layers("full:0", 2048)
        .unwrap_err()
        .to_string();
    assert!(
        message.starts_with("invalid --groups `full:0`: full has no layers"),
        "{message}"
    );

    // Bytes per token per layer: 0 or over 16 MiB.
    for bytes in [0, KvModel::MAX_BYTES_PER_TOKEN_LAYER + 1] {
        assert!(matches!(
            KvModel::parse_layers("full:4", bytes),
            Err(SimError::InvalidBytes {
                flag: "--kv-bytes-per-token-layer",
                ..
            })
        ));
    }
    // The block size must divide the window: the sequence layer says so.
    let gpt = KvModel::preset("gpt-oss-120b").unwrap();
    assert!(matches!(
        gpt.groups(256),
        Err(SimError::Groups(GroupError::SpanNotBlockMultiple { .. }))
    ));
    // More groups than a model may have.
    let wide = KvModel::parse_layers("full:1,sliding_window:128:100", 2048).unwrap();
    assert!(matches!(
        wide.groups(16),
        Err(SimError::Groups(GroupError::TooManyGroups {
            groups: 101,
            ..
        }))
    ));
}

#[test]
fn capacities_below_a_block_or_past_a_pool_are_refused() {
    let gpt = KvModel::preset("gpt-oss-120b").unwrap();
    let block = gpt.block_bytes(16).unwrap();
    assert_eq!(KvSetup::new(gpt, block).capacity_blocks(16).unwrap(), 1);
    match KvSetup::new(gpt, block - 1).capacity_blocks(16) {
        Err(err @ SimError::CapacityBelowBlock { .. }) => {
            assert_eq!(
                err.to_string(),
                "--capacity-bytes 589823 holds no block: one block of this model is 589824 bytes \
                 (block size x layers per group x bytes per token per layer)"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        KvSetup::new(gpt, 1 << 62).capacity_blocks(16),
        Err(SimError::CapacityTooLarge { .. })
    ));
}

#[test]
fn byte_counts_parse_whole_finite_numbers_only() {
    let parse = |text: &str| parse_bytes("--capacity-bytes", text);
    assert_eq!(parse("40000000000").unwrap(), 40_000_000_000);
    assert_eq!(parse("40G").unwrap(), 40_000_000_000);
    assert_eq!(parse("40e9").unwrap(), 40_000_000_000);
    assert_eq!(parse("2.5e9").unwrap(), 2_500_000_000);
    assert_eq!(parse("40_000_000_000").unwrap(), 40_000_000_000);
    for bad in [
        "0", "", "-1", "1.5", "NaN", "inf", "1e400", "1e19", "forty", "0e9",
    ] {
        assert!(
            matches!(
                parse(bad),
                Err(SimError::InvalidBytes {
                    flag: "--capacity-bytes",
                    ..
                })
            ),
            "{bad}: {:?}",
            parse(bad)
        );
    }
}
