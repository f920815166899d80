//! The auto traits of the public types, pinned (C-SEND-SYNC).

use kvbm_store_redis::{Namespace, RedisClusterStore, RedisConfig};

fn shared<T: Send + Sync + Unpin + 'static>() {}

#[test]
fn public_types_are_send_sync_and_static() {
    shared::<RedisClusterStore>();
    shared::<RedisConfig>();
    shared::<Namespace>();
}
