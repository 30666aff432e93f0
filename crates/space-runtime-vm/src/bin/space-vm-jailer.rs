//! `space-vm-jailer`: builds one VMM's jail and execs QEMU in it (see
//! `space_runtime_vm::jail`). Run by the node as root with a JSON `JailConfig` on stdin.

fn main() {
    std::process::exit(space_runtime_vm::jail::main());
}
