//! The lab manual's exercises 4.1–4.5, as the two sides run them, and the
//! command line both lab examples share.

use std::alloc::Layout;

use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::backend::QueuePair;
use rdma_ring::buf::{BaseBuf, RemoteAccess};
use rdma_ring::session::{Session, SessionBuilder, SessionConfig, SessionHost};

pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

pub const USAGE: &str = "usage: lab_server|lab_client [--device soft|NAME] [--gid-index N] \
     [--listen ADDR | --connect ADDR] [--cm]";

/// 4.1's message.
const HELLO: &[u8] = b"hello from the client";
/// 4.2's message and immediate.
const WITH_IMM: &[u8] = b"a message with immediate data";
const IMM: u32 = 0x4242;
/// 4.5's immediate.
const WRITE_IMM: u32 = 45;
/// Regions of 4.3–4.5.
const REGION: usize = 4096;

fn pattern(step: u8) -> impl Fn(usize) -> u8 {
    move |i| (i as u8).wrapping_mul(31).wrapping_add(step)
}

fn check(what: &str, ok: bool) -> Result<()> {
    if ok {
        println!("  {what}: ok");
        Ok(())
    } else {
        Err(format!("{what}: FAILED").into())
    }
}

/// The client's side of 4.1–4.5.
pub async fn client<Q: QueuePair + Send + 'static>(s: &Session<Q>) -> Result<()> {
    let layout = Layout::from_size_align(REGION, 8)?;

    println!("[client] 4.1 send / receive");
    let mut msg = s.alloc_local_mr(Layout::array::<u8>(64)?)?;
    msg[..HELLO.len()].copy_from_slice(HELLO);
    let (sent, msg) = s.send(msg.slice(..HELLO.len())).await;
    sent?;
    check("[client] sent the greeting", true)?;

    println!("[client] 4.2 send / receive with immediate data");
    let mut region = msg.into_inner();
    region[..WITH_IMM.len()].copy_from_slice(WITH_IMM);
    let (sent, _) = s.send_with_imm(region.slice(..WITH_IMM.len()), IMM).await;
    sent?;
    check("[client] sent the message with immediate", true)?;

    println!("[client] 4.3 the server reads a region the client sent");
    let mut mine = s.alloc_local_mr(layout)?;
    let fill = pattern(3);
    mine.iter_mut().enumerate().for_each(|(i, b)| *b = fill(i));
    s.send_local_mr(mine, RemoteAccess::READ)
        .map_err(|(e, _)| e)?;
    let back = s.receive_local_mr().await?;
    check(
        "[client] the region came back intact",
        back.len() == REGION && back.iter().enumerate().all(|(i, &b)| b == fill(i)),
    )?;

    println!("[client] 4.4 the client writes into a region it requested");
    let remote = s.request_remote_mr(layout).await?;
    let mut local = s.alloc_local_mr(layout)?;
    let fill = pattern(4);
    local.iter_mut().enumerate().for_each(|(i, b)| *b = fill(i));
    let (written, local) = s.write(local, remote.remote()).await;
    check("[client] wrote the requested region", written? == REGION)?;
    s.send_remote_mr(remote)?;

    println!("[client] 4.5 write with immediate data");
    let remote = s.request_remote_mr(layout).await?;
    let mut local = local;
    let fill = pattern(5);
    local.iter_mut().enumerate().for_each(|(i, b)| *b = fill(i));
    let (written, _) = s.write_with_imm(local, remote.remote(), WRITE_IMM).await;
    check("[client] wrote with immediate data", written? == REGION)?;
    s.send_remote_mr(remote)?;

    let done = s.receive().await?;
    check(
        "[client] the server checked every step",
        &done[..] == b"done",
    )
}

/// The server's side of 4.1–4.5.
pub async fn server<Q: QueuePair + Send + 'static>(s: &Session<Q>) -> Result<()> {
    println!("[server] 4.1 send / receive");
    let got = s.receive().await?;
    check("[server] received the greeting", &got[..] == HELLO)?;

    println!("[server] 4.2 send / receive with immediate data");
    let (got, imm) = s.receive_with_imm().await?;
    check(
        "[server] received the message and its immediate",
        &got[..] == WITH_IMM && imm == Some(IMM),
    )?;

    println!("[server] 4.3 the server reads a region the client sent");
    let remote = s.receive_remote_mr().await?;
    let into = s.alloc_local_mr_zeroed(Layout::from_size_align(remote.len() as usize, 8)?)?;
    let (read, into) = s.read(into, remote.remote()).await;
    let fill = pattern(3);
    check(
        "[server] read the client's region",
        read? == REGION && into.iter().enumerate().all(|(i, &b)| b == fill(i)),
    )?;
    s.send_remote_mr(remote)?;

    println!("[server] 4.4 the client writes into a region it requested");
    let region = s.receive_local_mr().await?;
    let fill = pattern(4);
    check(
        "[server] the region the client wrote came back",
        region.len() == REGION && region.iter().enumerate().all(|(i, &b)| b == fill(i)),
    )?;

    println!("[server] 4.5 write with immediate data");
    check(
        "[server] received the immediate",
        s.receive_write_imm().await? == WRITE_IMM,
    )?;
    let region = s.receive_local_mr().await?;
    let fill = pattern(5);
    check(
        "[server] the region written with immediate came back",
        region.iter().enumerate().all(|(i, &b)| b == fill(i)),
    )?;

    let mut done = s.alloc_local_mr(Layout::array::<u8>(4)?)?;
    done.copy_from_slice(b"done");
    s.send(done.slice(..)).await.0?;
    Ok(())
}

/// The exit of `example`: its verdict, printed.
pub fn finish(example: &str, result: Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => {
            println!("{example}: all checks passed");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{example}: FAILED: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// What the command line asks for.
pub struct Args {
    pub device: String,
    pub gid_index: Option<u8>,
    pub listen: Option<String>,
    pub connect: Option<String>,
    pub cm: bool,
}

pub fn args() -> Result<Option<Args>> {
    let mut args = std::env::args().skip(1);
    let mut out = Args {
        device: "soft".into(),
        gid_index: None,
        listen: None,
        connect: None,
        cm: false,
    };
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| {
            args.next()
                .ok_or_else(|| format!("{flag} needs a value; {USAGE}"))
        };
        match arg.as_str() {
            "--device" => out.device = value("--device")?,
            "--gid-index" => out.gid_index = Some(value("--gid-index")?.parse()?),
            "--listen" => out.listen = Some(value("--listen")?),
            "--connect" => out.connect = Some(value("--connect")?),
            "--cm" => out.cm = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            other => return Err(format!("unknown argument {other:?}; {USAGE}").into()),
        }
    }
    Ok(Some(out))
}

/// Both sides in one process on the soft device.
pub fn both_on_soft() -> Result<()> {
    println!("device: soft (in-process), both sides in one process");
    let (client_session, server_session) =
        SessionHost::soft_pair(&SoftDevice::new(), SessionConfig::default())?;
    let server_thread =
        std::thread::spawn(move || futures::executor::block_on(server(&server_session)));
    futures::executor::block_on(client(&client_session))?;
    server_thread
        .join()
        .map_err(|_| "the server thread panicked")?
}

/// A builder for `args`' device.
pub fn builder(args: &Args) -> SessionBuilder {
    let mut builder = SessionBuilder::default();
    if args.device != "soft" && !args.cm {
        builder = builder.device(&args.device);
    }
    if let Some(index) = args.gid_index {
        builder = builder.gid_index(index);
    }
    builder
}
