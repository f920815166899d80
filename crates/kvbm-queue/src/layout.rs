//! [`KvLayout`]: a model's KV-cache geometry, which turns bytes into blocks.

use crate::QueueError;

/// A model's KV-cache geometry on one tensor-parallel rank.
///
/// Every token stores a key and a value vector per layer and KV head, so one
/// token costs `2 × layers × kv_heads_per_rank × head_dim × dtype_bytes`
/// bytes. Tensor parallelism splits the KV heads across ranks; when there are
/// more ranks than heads, each rank holds one (replicated) head.
///
/// ```
/// use kvbm_queue::KvLayout;
///
/// // Llama-3-8B: 32 layers, 8 KV heads of 128 dims, bf16.
/// let llama = KvLayout::new(32, 8, 128, 2)?;
/// assert_eq!(llama.bytes_per_token(), 131_072); // 128 KiB
/// assert_eq!(llama.tensor_parallel(2)?.bytes_per_token(), 65_536);
/// # Ok::<(), kvbm_queue::QueueError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    num_layers: u32,
    num_kv_heads: u32,
    head_dim: u32,
    dtype_bytes: u32,
    tp_size: u32,
    bytes_per_token: u64,
}

impl KvLayout {
    /// A layout for one rank (no tensor parallelism).
    ///
    /// # Errors
    ///
    /// [`QueueError::Zero`] if any argument is zero, and
    /// [`QueueError::LayoutOverflow`] if a token's size overflows `u64`.
    pub fn new(
        num_layers: u32,
        num_kv_heads: u32,
        head_dim: u32,
        dtype_bytes: u32,
    ) -> Result<Self, QueueError> {
        for (value, field) in [
            (num_layers, "num_layers"),
            (num_kv_heads, "num_kv_heads"),
            (head_dim, "head_dim"),
            (dtype_bytes, "dtype_bytes"),
        ] {
            if value == 0 {
                return Err(QueueError::Zero { field });
            }
        }
        Self {
            num_layers,
            num_kv_heads,
            head_dim,
            dtype_bytes,
            tp_size: 1,
            bytes_per_token: 0,
        }
        .sized()
    }

    /// The same model split across `tp_size` tensor-parallel ranks; sizes are
    /// then per rank (each rank's pool holds its share of every block).
    ///
    /// # Errors
    ///
    /// [`QueueError::Zero`] if `tp_size` is zero, and
    /// [`QueueError::TensorParallel`] if neither of `kv_heads` and `tp_size`
    /// divides the other (heads could not be split or replicated evenly).
    pub fn tensor_parallel(self, tp_size: u32) -> Result<Self, QueueError> {
        if tp_size == 0 {
            return Err(QueueError::Zero { field: "tp_size" });
        }
        let heads = self.num_kv_heads;
        let even = if tp_size <= heads {
            heads.is_multiple_of(tp_size)
        } else {
            tp_size.is_multiple_of(heads)
        };
        if !even {
            return Err(QueueError::TensorParallel {
                kv_heads: heads,
                tp_size,
            });
        }
        Self { tp_size, ..self }.sized()
    }

    fn sized(mut self) -> Result<Self, QueueError> {
        let overflow = QueueError::LayoutOverflow { what: "token" };
        self.bytes_per_token = [
            u64::from(self.num_layers),
            u64::from(self.kv_heads_per_rank()),
            u64::from(self.head_dim),
            u64::from(self.dtype_bytes),
        ]
        .into_iter()
        .try_fold(2u64, u64::checked_mul)
        .ok_or(overflow)?;
        Ok(self)
    }

    /// KV heads stored on each rank: `kv_heads / tp`, at least one.
    pub fn kv_heads_per_rank(&self) -> u32 {
        (self.num_kv_heads / self.tp_size).max(1)
    }

    /// Tensor-parallel ranks (1 unless set with [`tensor_parallel`](Self::tensor_parallel)).
    pub fn tp_size(&self) -> u32 {
        self.tp_size
    }

    /// KV bytes one token needs on one rank.
    pub fn bytes_per_token(&self) -> u64 {
        self.bytes_per_token
    }

    /// KV bytes one block of `block_tokens` tokens needs on one rank, or
    /// `None` if that overflows `u64`.
    pub fn bytes_per_block(&self, block_tokens: u32) -> Option<u64> {
        self.bytes_per_token.checked_mul(u64::from(block_tokens))
    }
}
