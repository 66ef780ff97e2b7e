//! The portable data path between two model processes of one node, as
//! `portable_copy` (a 13.3 driver) and `classic_unicast` (the classic
//! fallback on 13.0) both run it: endpoints exported and imported, the
//! owner's memory shared by POSIX descriptor and registered as a window, and
//! every byte checked on both sides.

use std::time::Duration;

use cuda_endpoints::model::Model;
use cuda_endpoints::{
    Allocation, Context, CopyBatch, CopyPath, Endpoint, Exportable, FabricHandle, Mapped, PosixFd,
    Ready, Spec, Stream, Unicast,
};

/// The bind alignment of both drivers these tests run on.
const ALIGN: u64 = 2 << 20;
/// Every wait of the exchange is bounded by this.
const T: Duration = Duration::from_secs(5);

/// `n` bytes that differ from their neighbours and from other seeds'.
pub fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i % 251) as u8 ^ seed.wrapping_mul(37))
        .collect()
}

/// One process's side: its exportable endpoint and the memory bound to it.
struct Side<'a> {
    ctx: &'a Context,
    dev: i32,
    ep: Endpoint<Ready, Unicast<Exportable>>,
    mem: Mapped<PosixFd>,
}

/// Two processes (`models`, to read their memory; `sides`, each one's
/// context and device), both on the portable path: each creates an
/// exportable unicast endpoint on its device and binds `PosixFd` memory;
/// each imports the other's endpoint and that memory (by POSIX descriptor:
/// one node), maps it and registers it as the owner's window; then each puts
/// 64 KiB into the other's endpoint and gets them back, and the owner sees
/// every byte in the memory it bound. Everything made here is dropped before
/// it returns; the contexts stay the caller's to check.
pub fn put_and_get_through_posix_fd_windows(models: [&Model; 2], sides: [(&Context, i32); 2]) {
    let sides: Vec<Side> = sides
        .into_iter()
        .map(|(ctx, dev)| {
            let ep = ctx
                .reserve_one()
                .unwrap()
                .create(Spec::unicast(dev, ALIGN).exportable())
                .unwrap()
                .wait(T)
                .unwrap();
            let mem = super::mapped(ctx, dev, ALIGN);
            Side { ctx, dev, ep, mem }
        })
        .collect();
    let bindings: Vec<_> = sides
        .iter()
        .map(|s| s.ep.bind(s.dev, 0, &s.mem).unwrap())
        .collect();
    let peers: Vec<_> = (0..2)
        .map(|me| {
            let (mine, theirs) = (&sides[me], &sides[1 - me]);
            let h = FabricHandle::<Unicast<Exportable>>::from_bytes(
                &theirs.ep.export().unwrap().to_bytes(),
            )
            .unwrap();
            let ep = mine
                .ctx
                .reserve_one()
                .unwrap()
                .import(&h)
                .unwrap()
                .wait(T)
                .unwrap();
            let fd = theirs.mem.export_fd().unwrap();
            let window = Allocation::<PosixFd>::import_fd(mine.ctx, &fd, ALIGN)
                .unwrap()
                .map(&[mine.dev])
                .unwrap();
            drop(fd);
            ep.add_peer_window(1 - me as u32, theirs.dev, 0, &window)
                .unwrap();
            // The endpoint keeps the mapping alive from now on.
            drop(window);
            ep
        })
        .collect();
    for me in 0..2 {
        let (mine, theirs, owner) = (&sides[me], &sides[1 - me], models[1 - me]);
        assert_eq!(mine.ctx.copy_path(), CopyPath::Portable);
        let stream = Stream::new(mine.ctx, mine.dev).unwrap();
        let bytes = pattern(10 + me as u8, 65536);
        let offset = 4096 * (1 + me as u64);
        stream
            .enqueue(CopyBatch::new().put_host(bytes.clone(), &peers[me], offset))
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(
            owner
                .read(theirs.mem.device_ptr() + offset, bytes.len())
                .unwrap(),
            bytes,
            "the owner sees every byte in the memory it bound"
        );
        let got = stream
            .enqueue(CopyBatch::new().get_host(&peers[me], offset, 65536))
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(got.received, vec![bytes]);
    }
    drop(peers);
    drop(bindings);
}
