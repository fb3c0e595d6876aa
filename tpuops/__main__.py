from tpuops.cli.main import entry

entry()
