//! `cuda-endpoints-fabric`: runs a command on a model fabric that its
//! processes share (see `cuda_endpoints::fabric::launcher` for the usage).

fn main() -> std::process::ExitCode {
    cuda_endpoints::fabric::launcher::main()
}
