//! A fenced put on an etcd key: the token of the last accepted write lives in a companion
//! key ([`fence_key`]), compared and written in the same transaction as the value.

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};

use crate::FenceError;
use crate::error::check_token;

/// What [`fence_key`] appends to a key.
pub const FENCE_SUFFIX: &[u8] = b":fence";

/// The companion key holding `key`'s token: `key` followed by [`FENCE_SUFFIX`]. Do not
/// store data of your own under a name that ends that way.
pub fn fence_key(key: &[u8]) -> Vec<u8> {
    [key, FENCE_SUFFIX].concat()
}

/// The token as the fence key's value: 20 decimal digits, zero-padded, so that etcd's
/// bytewise `<` on values orders tokens numerically (and `etcdctl get` shows a number).
pub fn encode_token(token: u64) -> String {
    format!("{token:020}")
}

/// Put `value` at `key` and `token` at its [`fence_key`], only if the stored token is
/// smaller (or there is none yet): one transaction, one round trip.
///
/// The transaction: if the fence key does not exist (`create_revision == 0`), put both;
/// otherwise, in a nested transaction, if the fence key's value is `<` the encoded token,
/// put both, else read the stored token to report it.
///
/// # Errors
/// - [`FenceError::StaleToken`]: the stored token is `>= token`; nothing changed.
/// - [`FenceError::InvalidInput`]: `token` is 0 or `key` is empty, before any I/O.
/// - [`FenceError::Store`]: etcd failed (the client's own timeouts apply).
pub async fn put(
    client: &mut Client,
    key: impl Into<Vec<u8>>,
    value: impl Into<Vec<u8>>,
    token: u64,
) -> Result<(), FenceError> {
    check_token(token)?;
    let key = key.into();
    if key.is_empty() {
        return Err(FenceError::InvalidInput {
            what: "key",
            why: "an etcd key cannot be empty".into(),
        });
    }
    let fence = fence_key(&key);
    let encoded = encode_token(token);
    let write = [
        TxnOp::put(key, value, None),
        TxnOp::put(fence.clone(), encoded.clone(), None),
    ];
    // etcd's transactions only AND their compares: "absent, or smaller" is two levels.
    let if_smaller = Txn::new()
        .when([Compare::value(fence.clone(), CompareOp::Less, encoded)])
        .and_then(write.clone())
        .or_else([TxnOp::get(fence.clone(), None::<GetOptions>)]);
    let txn = Txn::new()
        .when([Compare::create_revision(fence, CompareOp::Equal, 0)])
        .and_then(write)
        .or_else([TxnOp::txn(if_smaller)]);
    let answer = client
        .txn(txn)
        .await
        .map_err(|e| FenceError::store("etcd", e))?;
    if answer.succeeded() {
        return Ok(());
    }
    let Some(TxnOpResponse::Txn(inner)) = answer.op_responses().into_iter().next() else {
        return Err(FenceError::store(
            "etcd",
            "no nested answer to a fenced put",
        ));
    };
    if inner.succeeded() {
        return Ok(());
    }
    let stored = match inner.op_responses().into_iter().next() {
        Some(TxnOpResponse::Get(get)) => get.kvs().first().map(|kv| decode(kv.value())),
        _ => None,
    };
    Err(FenceError::StaleToken {
        token,
        stored: stored.flatten().unwrap_or(0),
    })
}

/// Read `key`'s value and the token that wrote it (one transaction, so the two agree), or
/// `None` when it was never written with [`put`].
///
/// # Errors
/// [`FenceError::Store`]: etcd failed, or the fence key does not hold a token.
pub async fn get(
    client: &mut Client,
    key: impl Into<Vec<u8>>,
) -> Result<Option<(Vec<u8>, u64)>, FenceError> {
    let key = key.into();
    let fence = fence_key(&key);
    let txn = Txn::new().and_then([
        TxnOp::get(key, None::<GetOptions>),
        TxnOp::get(fence, None::<GetOptions>),
    ]);
    let answer = client
        .txn(txn)
        .await
        .map_err(|e| FenceError::store("etcd", e))?;
    let mut firsts = answer.op_responses().into_iter().map(|op| match op {
        TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.value().to_vec()),
        _ => None,
    });
    let (value, fence) = (firsts.next().flatten(), firsts.next().flatten());
    match (value, fence) {
        (Some(value), Some(fence)) => match decode(&fence) {
            Some(token) => Ok(Some((value, token))),
            None => Err(FenceError::store(
                "etcd",
                "the fence key does not hold a token",
            )),
        },
        _ => Ok(None),
    }
}

fn decode(stored: &[u8]) -> Option<u64> {
    std::str::from_utf8(stored).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoded_tokens_order_bytewise_as_numbers() {
        let tokens = [
            1,
            9,
            10,
            99,
            100,
            1 << 53,
            (1 << 53) + 1,
            u64::MAX - 1,
            u64::MAX,
        ];
        for pair in tokens.windows(2) {
            assert!(encode_token(pair[0]) < encode_token(pair[1]), "{pair:?}");
        }
        assert_eq!(decode(encode_token(u64::MAX).as_bytes()), Some(u64::MAX));
    }
}
