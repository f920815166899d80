//! [`RedisConfig`] validation and key derivation.

use super::*;

fn config() -> RedisConfig {
    RedisConfig::new(["redis://127.0.0.1:7000"], "model-a", 64, 16)
}

#[test]
fn a_valid_config_passes() {
    config().validate().unwrap();
}

/// Makes one field of a valid config invalid.
type Break = fn(&mut RedisConfig);

#[test]
fn each_bad_field_is_a_config_error() {
    let cases: [(&str, Break); 9] = [
        ("no cluster nodes", |c| c.nodes.clear()),
        ("not a redis:// URL", |c| c.nodes = vec!["http://x".into()]),
        ("block size of 0", |c| c.block_bytes = 0),
        ("capacity of 0", |c| c.capacity_blocks = 0),
        ("a pool of 0", |c| c.pool_size = 0),
        ("a pool of 1025", |c| c.pool_size = 1025),
        ("response_timeout of 0", |c| {
            c.response_timeout = Duration::ZERO;
        }),
        ("empty", |c| c.namespace.clear()),
        ("hash tag", |c| c.namespace = "a{b}".into()),
    ];
    for (expect, break_it) in cases {
        let mut bad = config();
        break_it(&mut bad);
        match bad.validate() {
            Err(StoreError::Config(why)) => assert!(why.contains(expect), "{why:?} vs {expect:?}"),
            other => panic!("{expect}: {other:?}"),
        }
    }
}

#[test]
fn namespaces_refuse_control_characters_and_long_names() {
    assert!(Namespace::new("a\nb").is_err());
    assert!(Namespace::new("x".repeat(Namespace::MAX_BYTES)).is_ok());
    assert!(Namespace::new("x".repeat(Namespace::MAX_BYTES + 1)).is_err());
}

#[test]
fn keys_are_the_namespace_and_32_hex_digits() {
    let ns = Namespace::new("m").unwrap();
    assert_eq!(ns.redis_key(u128::MAX), format!("m:kv:{}", "f".repeat(32)));
    assert_eq!(ns.redis_key(1).len(), "m:kv:".len() + 32);
}
