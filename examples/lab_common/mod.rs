//! The lab manual's exercises 4.1–4.5, as the two sides run them, and the
//! command line both lab examples share.

use std::alloc::Layout;

use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::backend::QueuePair;
use rdma_ring::buf::{BaseBuf, RemoteAccess};
use rdma_ring::session::{Session, SessionBuilder, SessionConfig, SessionHost};

pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

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
    // Whether it arrived intact is the server's check.
    println!("  [client] sent the greeting");

    println!("[client] 4.2 send / receive with immediate data");
    let mut region = msg.into_inner();
    region[..WITH_IMM.len()].copy_from_slice(WITH_IMM);
    let (sent, _) = s.send_with_imm(region.slice(..WITH_IMM.len()), IMM).await;
    sent?;
    println!("  [client] sent the message with immediate");

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
        region.len() == REGION && region.iter().enumerate().all(|(i, &b)| b == fill(i)),
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

/// Which of the two lab examples is running.
#[allow(dead_code)] // each example constructs its own side only
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Server,
    Client,
}

impl Side {
    pub fn usage(self) -> &'static str {
        match self {
            Side::Server => {
                "usage: lab_server [--device soft|NAME] [--gid-index N] [--cm] [--listen ADDR]"
            }
            Side::Client => {
                "usage: lab_client [--device soft|NAME] [--gid-index N] [--cm] [--connect ADDR]"
            }
        }
    }
}

/// What the command line asks for.
pub struct Args {
    /// `None`: the soft device without an address, the first RDMA device
    /// with one.
    pub device: Option<String>,
    pub gid_index: Option<u8>,
    /// `--listen` for the server, `--connect` for the client.
    pub addr: Option<String>,
    pub cm: bool,
}

/// The command line of `side`; `--help` prints the usage and exits.
pub fn args(side: Side) -> Result<Args> {
    let usage = side.usage();
    let mut args = std::env::args().skip(1);
    let mut out = Args {
        device: None,
        gid_index: None,
        addr: None,
        cm: false,
    };
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| {
            args.next()
                .ok_or_else(|| format!("{flag} needs a value; {usage}"))
        };
        match (arg.as_str(), side) {
            ("--device", _) => out.device = Some(value("--device")?),
            ("--gid-index", _) => {
                let v = value("--gid-index")?;
                out.gid_index = Some(
                    v.parse()
                        .map_err(|e| format!("--gid-index {v:?}: {e}; {usage}"))?,
                );
            }
            ("--listen", Side::Server) => out.addr = Some(value("--listen")?),
            ("--connect", Side::Client) => out.addr = Some(value("--connect")?),
            ("--connect", Side::Server) => {
                return Err(
                    format!("lab_server listens: --listen ADDR, not --connect; {usage}").into(),
                )
            }
            ("--listen", Side::Client) => {
                return Err(
                    format!("lab_client connects: --connect ADDR, not --listen; {usage}").into(),
                )
            }
            ("--cm", _) => out.cm = true,
            ("-h" | "--help", _) => {
                println!("{usage}");
                std::process::exit(0);
            }
            (other, _) => return Err(format!("unknown argument {other:?}; {usage}").into()),
        }
    }
    let address_flag = match side {
        Side::Server => "--listen",
        Side::Client => "--connect",
    };
    match (&out.addr, out.device.as_deref()) {
        (None, Some(name)) if name != "soft" => {
            return Err(format!(
                "--device {name} needs {address_flag} ADDR: one process runs on the soft device only; {usage}"
            )
            .into())
        }
        (None, _) if out.cm || out.gid_index.is_some() => {
            return Err(format!(
                "--cm and --gid-index need {address_flag} ADDR: one process runs on the soft device; {usage}"
            )
            .into())
        }
        (Some(_), Some("soft")) => {
            return Err(format!(
                "{address_flag} needs a real device: the soft device lives in one process; {usage}"
            )
            .into())
        }
        (Some(_), Some(name)) if out.cm => {
            return Err(format!(
                "--device {name} does not apply to --cm: rdma_cm uses the device that routes to the address; {usage}"
            )
            .into())
        }
        _ => {}
    }
    Ok(out)
}

/// Both sides in one process on the soft device.
pub fn both_on_soft() -> Result<()> {
    println!("device: soft (in-process), both sides in one process");
    let (client_session, server_session) =
        SessionHost::soft_pair(&SoftDevice::new(), SessionConfig::default())?;
    // The thread owns its session, so a server that fails closes it on
    // the way out and the client's next step fails at once.
    let server_thread =
        std::thread::spawn(move || futures::executor::block_on(server(&server_session)));
    let client_result = futures::executor::block_on(client(&client_session));
    // Closed before the join, for the same reason the other way round.
    drop(client_session);
    crate::one_process::verdict(("server", server_thread.join()), ("client", client_result))
        .map(|_| ())
}

/// A builder for rdma_cm, which uses the device that routes to the address.
pub fn cm_builder(args: &Args) -> SessionBuilder {
    let mut builder = SessionBuilder::default();
    if let Some(index) = args.gid_index {
        builder = builder.gid_index(index);
    }
    builder
}

/// A builder for the TCP handshake on `args`' device or, without one, on
/// the first RDMA device, named here so that what is printed is what is
/// opened; and the device's name.
pub fn device_builder(args: &Args) -> Result<(SessionBuilder, String)> {
    let name =
        crate::device_choice::for_address(args.device.as_deref(), "see --help", "use --cm, ")?;
    Ok((cm_builder(args).device(&name), name))
}
