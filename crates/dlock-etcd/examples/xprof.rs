use std::time::{Duration, Instant};
use dlock_core::{DistributedLock, LockOptions, Wait};
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp};

fn p50(v: &mut Vec<Duration>) -> String { v.sort(); format!("{:.0?}/{:.1?}", v[v.len() / 2], v[v.len() * 99 / 100]) }

#[tokio::main]
async fn main() {
    let lock = dlock_etcd::from_url("etcd://127.0.0.1:2379").await.unwrap();
    let opts = LockOptions::new().ttl(Duration::from_secs(30)).wait(Wait::For(Duration::from_secs(60)));
    let mut raw = etcd_client::Client::connect(["127.0.0.1:2379"], None).await.unwrap();
    let lease = raw.lease_grant(30, None).await.unwrap().id();
    for round in 0..3 {
        let (mut a, mut r, mut c) = (vec![], vec![], vec![]);
        for _ in 0..500 {
            let t0 = Instant::now();
            let l = lock.acquire("xprof-k", &opts).await.unwrap();
            let t1 = Instant::now();
            l.release().await.unwrap();
            let t2 = Instant::now();
            a.push(t1 - t0); r.push(t2 - t1); c.push(t2 - t0);
        }
        let (mut rp, mut rd, mut tp, mut td) = (vec![], vec![], vec![], vec![]);
        for i in 0..500 {
            let t0 = Instant::now();
            raw.put("xprof-raw", "", None).await.unwrap();
            let t1 = Instant::now();
            raw.delete("xprof-raw", None).await.unwrap();
            let t2 = Instant::now();
            rp.push(t1 - t0); rd.push(t2 - t1);
            let my = format!("xprof-t/{i:x}");
            let txn = Txn::new().when([Compare::create_revision(my.as_str(), CompareOp::Equal, 0)]).and_then([
                TxnOp::put(my.as_str(), "", std::env::var_os("X_LEASE").map(|_| PutOptions::new().with_lease(lease))),
            ].into_iter().chain(std::env::var_os("X_RANGES").map(|_| vec![
                TxnOp::get("xprof-t/", Some(GetOptions::new().with_prefix().with_sort(SortTarget::Create, SortOrder::Ascend).with_limit(1))),
                TxnOp::get("xprof-t/", Some(GetOptions::new().with_prefix().with_sort(SortTarget::Create, SortOrder::Descend).with_limit(2))),
            ]).into_iter().flatten()).collect::<Vec<_>>());
            let t0 = Instant::now();
            let ans = raw.txn(txn).await.unwrap();
            let t1 = Instant::now();
            let rev = ans.header().unwrap().revision();
            let txn = Txn::new().when([Compare::create_revision(my.as_str(), CompareOp::Equal, rev)]).and_then([TxnOp::delete(my.as_str(), None)]);
            raw.txn(txn).await.unwrap();
            let t2 = Instant::now();
            tp.push(t1 - t0); td.push(t2 - t1);
        }
        println!("round {round}: lock acquire {:?} release {:?} cycle {:?} | raw put {:?} del {:?} | txn put {:?} del {:?}",
            p50(&mut a), p50(&mut r), p50(&mut c), p50(&mut rp), p50(&mut rd), p50(&mut tp), p50(&mut td));
    }
    raw.lease_revoke(lease).await.unwrap();
}
