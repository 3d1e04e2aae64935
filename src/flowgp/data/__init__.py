"""Data in and out of the library: tables (CSV, Parquet, .npy, streamed in blocks), the image sets, the
synthetic sets and the demo data. Imports nothing else from flowgp."""
