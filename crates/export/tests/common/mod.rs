//! Test doubles and helpers for the export tests: an in-memory target, a
//! registry, a server on 127.0.0.1:0 plus a unix socket, and a raw client.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use trireme_export::{ExportRegistry, NbdConfig, NbdServer};
use trireme_types::{
    BlockStatusExtent, BlockTarget, Completer, TargetError, TargetReply, TargetRequest, ZeroFlags,
};

/// Every test step is bounded by this.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(30);
pub const MEMORY_BLOCK_BYTES: u64 = 4096;
pub const DISK_SIZE_BYTES: u64 = 4 * 1024 * 1024;

/// A test double for the export layer only: bytes plus an allocation map.
pub struct MemoryTarget {
    size_bytes: u64,
    read_only: bool,
    state: Mutex<(Vec<u8>, Vec<bool>)>,
}

impl MemoryTarget {
    pub fn new(size_bytes: u64, read_only: bool) -> Self {
        let blocks = size_bytes.div_ceil(MEMORY_BLOCK_BYTES) as usize;
        MemoryTarget {
            size_bytes,
            read_only,
            state: Mutex::new((vec![0; size_bytes as usize], vec![false; blocks])),
        }
    }

    pub fn contents(&self, offset: u64, length: usize) -> Vec<u8> {
        let state = self.state.lock().unwrap();
        state.0[offset as usize..offset as usize + length].to_vec()
    }

    fn check(&self, offset: u64, length: u64) -> Result<(), TargetError> {
        match offset.checked_add(length) {
            Some(end) if end <= self.size_bytes => Ok(()),
            _ => Err(TargetError::Invalid("out of range".into())),
        }
    }

    fn zero(&self, offset: u64, length: u64, keep_allocated: bool) {
        let mut state = self.state.lock().unwrap();
        let (bytes, allocated) = &mut *state;
        bytes[offset as usize..(offset + length) as usize].fill(0);
        let first_whole = offset.div_ceil(MEMORY_BLOCK_BYTES);
        let end_whole = (offset + length) / MEMORY_BLOCK_BYTES;
        for block in first_whole..end_whole {
            allocated[block as usize] = keep_allocated;
        }
    }
}

impl BlockTarget for MemoryTarget {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read(&self, offset: u64, buffer: &mut [u8]) -> Result<(), TargetError> {
        self.check(offset, buffer.len() as u64)?;
        let state = self.state.lock().unwrap();
        buffer.copy_from_slice(&state.0[offset as usize..offset as usize + buffer.len()]);
        Ok(())
    }
    fn write(
        &self,
        offset: u64,
        data: trireme_types::BlockBuf,
        _fua: bool,
    ) -> Result<(), TargetError> {
        if self.read_only {
            return Err(TargetError::ReadOnly);
        }
        self.check(offset, data.len() as u64)?;
        let mut state = self.state.lock().unwrap();
        state.0[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
        let first = offset / MEMORY_BLOCK_BYTES;
        let last = (offset + data.len() as u64 - 1) / MEMORY_BLOCK_BYTES;
        for block in first..=last {
            state.1[block as usize] = true;
        }
        Ok(())
    }
    fn flush(&self) -> Result<(), TargetError> {
        Ok(())
    }
    fn trim(&self, offset: u64, length: u64, _fua: bool) -> Result<(), TargetError> {
        self.check(offset, length)?;
        self.zero(offset, length, false);
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, length: u64, flags: ZeroFlags) -> Result<(), TargetError> {
        self.check(offset, length)?;
        self.zero(offset, length, flags.no_hole);
        Ok(())
    }
    fn block_status(
        &self,
        offset: u64,
        length: u64,
    ) -> Result<Vec<BlockStatusExtent>, TargetError> {
        self.check(offset, length)?;
        let state = self.state.lock().unwrap();
        let end = offset + length;
        let mut extents: Vec<BlockStatusExtent> = Vec::new();
        let mut position = offset;
        while position < end {
            let block = position / MEMORY_BLOCK_BYTES;
            let block_end = ((block + 1) * MEMORY_BLOCK_BYTES).min(end);
            let hole = !state.1[block as usize];
            match extents.last_mut() {
                Some(last) if last.hole == hole => last.length_bytes += block_end - position,
                _ => extents.push(BlockStatusExtent {
                    length_bytes: block_end - position,
                    hole,
                    zero: hole,
                }),
            }
            position = block_end;
        }
        Ok(extents)
    }
}

/// A target that takes requests asynchronously ([`BlockTarget::submit`])
/// and completes them on a thread of its own, a batch at a time in the
/// reverse of their arrival order, as a replicated volume may.
pub struct AsyncTarget {
    pub memory: Arc<MemoryTarget>,
    jobs: Mutex<std::sync::mpsc::Sender<(TargetRequest, Completer)>>,
}

impl AsyncTarget {
    pub fn new(size_bytes: u64) -> Arc<AsyncTarget> {
        let memory = Arc::new(MemoryTarget::new(size_bytes, false));
        let (sender, receiver) = std::sync::mpsc::channel::<(TargetRequest, Completer)>();
        let worker = memory.clone();
        std::thread::spawn(move || {
            while let Ok(first) = receiver.recv() {
                std::thread::sleep(Duration::from_micros(300));
                let mut batch = vec![first];
                while let Ok(job) = receiver.try_recv() {
                    batch.push(job);
                }
                // Every write of the batch lands first, in arrival order;
                // then the completions go out newest first.
                let mut results = Vec::new();
                for (request, done) in batch {
                    results.push((worker.run(request), done));
                }
                for (result, done) in results.into_iter().rev() {
                    done(result);
                }
            }
        });
        Arc::new(AsyncTarget {
            memory,
            jobs: Mutex::new(sender),
        })
    }
}

impl MemoryTarget {
    fn run(&self, request: TargetRequest) -> Result<TargetReply, TargetError> {
        match request {
            TargetRequest::Read { offset, length } => {
                let mut buffer = vec![0; length as usize];
                self.read(offset, &mut buffer)?;
                Ok(if buffer.iter().all(|&byte| byte == 0) {
                    TargetReply::Zeroes
                } else {
                    TargetReply::Data(buffer)
                })
            }
            TargetRequest::Write { offset, data, fua } => {
                self.write(offset, data, fua).map(|()| TargetReply::Done)
            }
            TargetRequest::Flush => self.flush().map(|()| TargetReply::Done),
            TargetRequest::Trim {
                offset,
                length,
                fua,
            } => self.trim(offset, length, fua).map(|()| TargetReply::Done),
            TargetRequest::WriteZeroes {
                offset,
                length,
                flags,
            } => self
                .write_zeroes(offset, length, flags)
                .map(|()| TargetReply::Done),
        }
    }
}

impl BlockTarget for AsyncTarget {
    fn size_bytes(&self) -> u64 {
        self.memory.size_bytes()
    }
    fn read(&self, _offset: u64, _buffer: &mut [u8]) -> Result<(), TargetError> {
        panic!("an asynchronous target is never called synchronously for reads")
    }
    fn write(
        &self,
        _offset: u64,
        _data: trireme_types::BlockBuf,
        _fua: bool,
    ) -> Result<(), TargetError> {
        panic!("an asynchronous target is never called synchronously for writes")
    }
    fn flush(&self) -> Result<(), TargetError> {
        panic!("an asynchronous target is never called synchronously for flushes")
    }
    fn trim(&self, _offset: u64, _length: u64, _fua: bool) -> Result<(), TargetError> {
        panic!("an asynchronous target is never called synchronously for trims")
    }
    fn write_zeroes(
        &self,
        _offset: u64,
        _length: u64,
        _flags: ZeroFlags,
    ) -> Result<(), TargetError> {
        panic!("an asynchronous target is never called synchronously for zeroes")
    }
    fn block_status(
        &self,
        offset: u64,
        length: u64,
    ) -> Result<Vec<BlockStatusExtent>, TargetError> {
        self.memory.block_status(offset, length)
    }
    fn submits(&self) -> bool {
        true
    }
    fn submit(&self, request: TargetRequest, done: Completer) {
        self.jobs
            .lock()
            .unwrap()
            .send((request, done))
            .expect("the worker runs as long as the target");
    }
}

pub struct Registry {
    pub disk: Arc<MemoryTarget>,
    pub read_only: Arc<MemoryTarget>,
    pub asynchronous: Arc<AsyncTarget>,
}

impl ExportRegistry for Registry {
    fn open(&self, name: &str) -> Result<Arc<dyn BlockTarget>, String> {
        match name {
            "disk" => Ok(self.disk.clone()),
            "ro" => Ok(self.read_only.clone()),
            "async" => Ok(self.asynchronous.clone()),
            _ => Err(format!("export '{name}' is not available")),
        }
    }
    fn names(&self) -> Vec<String> {
        vec!["disk".into(), "ro".into(), "async".into()]
    }
}

pub struct TestServer {
    pub address: SocketAddr,
    pub unix_socket: PathBuf,
    pub registry: Arc<Registry>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    _directory: tempfile::TempDir,
}

impl TestServer {
    pub async fn start() -> TestServer {
        let directory = tempfile::tempdir().unwrap();
        let unix_socket = directory.path().join("nbd.sock");
        let registry = Arc::new(Registry {
            disk: Arc::new(MemoryTarget::new(DISK_SIZE_BYTES, false)),
            read_only: Arc::new(MemoryTarget::new(64 * 1024, true)),
            asynchronous: AsyncTarget::new(DISK_SIZE_BYTES),
        });
        let config = NbdConfig {
            tcp_listen: Some("127.0.0.1:0".parse().unwrap()),
            unix_socket: Some(unix_socket.clone()),
        };
        let server = NbdServer::bind(&config).await.unwrap();
        let address = server.tcp_local_addr().unwrap();
        let (stop, stopped) = oneshot::channel();
        let served = registry.clone();
        let task = tokio::spawn(async move {
            server
                .serve(served, async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        TestServer {
            address,
            unix_socket,
            registry,
            stop: Some(stop),
            task: Some(task),
            _directory: directory,
        }
    }

    pub fn uri(&self, export: &str) -> String {
        format!("nbd://{}/{}", self.address, export)
    }

    pub fn unix_uri(&self, export: &str) -> String {
        format!(
            "nbd+unix:///{}?socket={}",
            export,
            self.unix_socket.display()
        )
    }

    /// Stops the server and waits for `serve` to return.
    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let task = self.task.take().unwrap();
        tokio::time::timeout(STEP_TIMEOUT, task)
            .await
            .expect("server stops in time")
            .unwrap();
    }
}

/// Runs a client program with a timeout; returns (success, stdout, stderr).
pub async fn run(program: &str, arguments: &[&str]) -> (bool, String, String) {
    let child = tokio::process::Command::new(program)
        .args(arguments)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(STEP_TIMEOUT, child)
        .await
        .unwrap_or_else(|_| panic!("{program} {arguments:?} timed out"))
        .unwrap_or_else(|error| panic!("{program} could not start: {error}"));
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

pub async fn run_ok(program: &str, arguments: &[&str]) -> String {
    let (success, stdout, stderr) = run(program, arguments).await;
    assert!(
        success,
        "{program} {arguments:?} failed:\n{stdout}\n{stderr}"
    );
    stdout
}

// ---- Raw protocol client ------------------------------------------------------

pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;

pub async fn connect(address: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let mut greeting = [0u8; 18];
    tokio::time::timeout(STEP_TIMEOUT, stream.read_exact(&mut greeting))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&greeting[..8], b"NBDMAGIC");
    stream
}

pub fn option(option: u32, data: &[u8]) -> Vec<u8> {
    let mut bytes = IHAVEOPT.to_be_bytes().to_vec();
    bytes.extend_from_slice(&option.to_be_bytes());
    bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
    bytes.extend_from_slice(data);
    bytes
}

pub fn go_data(name: &str) -> Vec<u8> {
    let mut data = (name.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(&0u16.to_be_bytes());
    data
}

/// Reads one option reply: (option, reply type, data).
pub async fn read_option_reply(stream: &mut TcpStream) -> (u32, u32, Vec<u8>) {
    let mut header = [0u8; 20];
    tokio::time::timeout(STEP_TIMEOUT, stream.read_exact(&mut header))
        .await
        .unwrap()
        .unwrap();
    let option = u32::from_be_bytes(header[8..12].try_into().unwrap());
    let reply_type = u32::from_be_bytes(header[12..16].try_into().unwrap());
    let length = u32::from_be_bytes(header[16..20].try_into().unwrap());
    let mut data = vec![0u8; length as usize];
    stream.read_exact(&mut data).await.unwrap();
    (option, reply_type, data)
}

/// Connects and negotiates `export` with OPT_GO and simple replies.
pub async fn connect_go(address: SocketAddr, export: &str) -> TcpStream {
    let mut stream = connect(address).await;
    stream.write_all(&3u32.to_be_bytes()).await.unwrap();
    stream
        .write_all(&option(7, &go_data(export)))
        .await
        .unwrap();
    loop {
        let (_, reply_type, _) = read_option_reply(&mut stream).await;
        match reply_type {
            1 => return stream,
            3 => continue,
            other => panic!("OPT_GO failed with reply type {other:#x}"),
        }
    }
}

pub fn request(flags: u16, command: u16, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
    let mut bytes = REQUEST_MAGIC.to_be_bytes().to_vec();
    bytes.extend_from_slice(&flags.to_be_bytes());
    bytes.extend_from_slice(&command.to_be_bytes());
    bytes.extend_from_slice(&cookie.to_be_bytes());
    bytes.extend_from_slice(&offset.to_be_bytes());
    bytes.extend_from_slice(&length.to_be_bytes());
    bytes
}

/// Reads one simple reply: (error, cookie).
pub async fn read_simple_reply(stream: &mut TcpStream) -> (u32, u64) {
    let mut reply = [0u8; 16];
    tokio::time::timeout(STEP_TIMEOUT, stream.read_exact(&mut reply))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&reply[..4], &0x6744_6698u32.to_be_bytes());
    (
        u32::from_be_bytes(reply[4..8].try_into().unwrap()),
        u64::from_be_bytes(reply[8..16].try_into().unwrap()),
    )
}

/// True once the server has closed the connection (reads EOF or reset).
pub async fn is_closed(stream: &mut TcpStream) -> bool {
    let mut sink = vec![0u8; 4096];
    loop {
        match tokio::time::timeout(STEP_TIMEOUT, stream.read(&mut sink)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// A fresh client can still negotiate and flush: the server kept serving.
pub async fn assert_still_serving(address: SocketAddr) {
    let mut stream = connect_go(address, "disk").await;
    stream.write_all(&request(0, 3, 42, 0, 0)).await.unwrap();
    assert_eq!(read_simple_reply(&mut stream).await, (0, 42));
}
