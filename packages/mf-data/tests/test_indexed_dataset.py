"""The .bin/.idx reader against Megatron-written files, the writer byte for byte, and bad files."""

from __future__ import annotations

import os
import shutil
import struct

import numpy as np
import pytest

from mf_data import DataFileError, DataFileNotFoundError, DType, IndexedDataset, IndexedDatasetBuilder


def _documents(ds: IndexedDataset):
    d = ds.document_indices
    for k in range(len(d) - 1):
        yield [ds[j] for j in range(d[k], d[k + 1])]


@pytest.mark.parametrize("name, dtype, docs", [("a_u16", np.uint16, 300), ("b_i32", np.int32, 200)])
def test_reads_megatron_files(megatron_fixtures, name, dtype, docs):
    ds = IndexedDataset(str(megatron_fixtures / name))
    assert ds.dtype is dtype
    assert ds.num_documents == docs == len(ds)
    assert ds.document_indices[0] == 0 and ds.document_indices[-1] == len(ds)
    # Every document ends with EOD id 1 (fixtures README) and ids stay below the vocabulary.
    ends = [int(ds[i][-1]) for i in range(len(ds))]
    assert ends == [1] * len(ds)
    vocab = 5000 if dtype is np.uint16 else 70000
    assert max(int(ds[i].max()) for i in range(len(ds))) < vocab
    # get() and slices agree with whole-sequence reads.
    assert np.array_equal(ds.get(3, 2, 5), ds[3][2:7])
    assert np.array_equal(ds.get(3, 4), ds[3][4:])
    assert all(np.array_equal(a, ds[i]) for i, a in enumerate(ds[0:10]))
    assert ds.num_tokens == int(ds.sequence_lengths.sum())


@pytest.mark.parametrize("name", ["a_u16", "b_i32"])
def test_builder_output_is_byte_identical_to_megatron(megatron_fixtures, tmp_path, name):
    src = IndexedDataset(str(megatron_fixtures / name))
    ref_bin = (megatron_fixtures / f"{name}.bin").read_bytes()
    ref_idx = (megatron_fixtures / f"{name}.idx").read_bytes()

    # add_document, as Megatron's preprocessing calls it.
    b = IndexedDatasetBuilder(str(tmp_path / "doc.bin"), dtype=src.dtype)
    for seqs in _documents(src):
        b.add_document(np.concatenate(seqs), [len(s) for s in seqs])
    b.finalize(str(tmp_path / "doc.idx"))
    assert (tmp_path / "doc.bin").read_bytes() == ref_bin
    assert (tmp_path / "doc.idx").read_bytes() == ref_idx

    # add_item + end_document, from lists of Python ints.
    b = IndexedDatasetBuilder(str(tmp_path / "item.bin"), dtype=src.dtype)
    for seqs in _documents(src):
        for s in seqs:
            b.add_item(s.tolist())
        b.end_document()
    b.finalize(str(tmp_path / "item.idx"))
    assert (tmp_path / "item.idx").read_bytes() == ref_idx

    # add_index copies a whole dataset; add_documents (bulk) writes the same bytes.
    b = IndexedDatasetBuilder(str(tmp_path / "merged.bin"), dtype=src.dtype)
    b.add_index(str(megatron_fixtures / name))
    b.finalize(str(tmp_path / "merged.idx"))
    assert (tmp_path / "merged.bin").read_bytes() == ref_bin
    assert (tmp_path / "merged.idx").read_bytes() == ref_idx

    b = IndexedDatasetBuilder(str(tmp_path / "bulk.bin"), dtype=src.dtype)
    b.add_documents(np.concatenate(src[0 : len(src)]), src.sequence_lengths, np.diff(src.document_indices))
    b.finalize(str(tmp_path / "bulk.idx"))
    assert (tmp_path / "bulk.idx").read_bytes() == ref_idx
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


def test_add_index_concatenates(megatron_fixtures, tmp_path):
    a = IndexedDataset(str(megatron_fixtures / "a_u16"))
    b = IndexedDatasetBuilder(str(tmp_path / "two.bin"), dtype=np.uint16)
    b.add_index(str(megatron_fixtures / "a_u16"))
    b.add_index(str(megatron_fixtures / "a_u16"))
    b.finalize(str(tmp_path / "two.idx"))
    two = IndexedDataset(str(tmp_path / "two"))
    assert two.num_documents == 2 * a.num_documents
    assert np.array_equal(two[len(a) + 7], a[7])
    with pytest.raises(DataFileError, match="dtype"):
        IndexedDatasetBuilder(str(tmp_path / "x.bin"), dtype=np.int32).add_index(str(megatron_fixtures / "a_u16"))


def test_dtype_codes_and_optimal_dtype():
    assert [DType.code_from_dtype(t) for t in (np.uint8, np.int8, np.int16, np.int32, np.int64, np.float64, np.float32, np.uint16)] == list(range(1, 9))
    assert DType.optimal_dtype(65499) is np.uint16 and DType.optimal_dtype(65500) is np.int32
    assert DType.size(8) == 2 and DType.size(np.int64) == 8


def test_builder_refuses_to_overwrite_and_never_leaves_partial_files(tmp_path, write_dataset):
    prefix = write_dataset([[5, 6, 7, 1], [8, 1]])
    before = (open(prefix + ".bin", "rb").read(), open(prefix + ".idx", "rb").read())
    with pytest.raises(FileExistsError):
        IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    # An overwrite that fails half-way leaves the old files as they were.
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16, overwrite=True)
    b.add_document([9, 9, 1], [3])
    with pytest.raises(ValueError, match="does not fit"):
        b.add_document([70000], [1])
    b.abort()
    assert (open(prefix + ".bin", "rb").read(), open(prefix + ".idx", "rb").read()) == before
    assert sorted(os.listdir(tmp_path)) == ["d.bin", "d.idx", "d.stats.json"]
    with pytest.raises(ValueError, match="add up"):
        IndexedDatasetBuilder(str(tmp_path / "e.bin"), dtype=np.uint16).add_document([1, 2, 3], [2])


def test_unmapped_reads_match_mapped(megatron_fixtures):
    mapped = IndexedDataset(str(megatron_fixtures / "b_i32"))
    unmapped = IndexedDataset(str(megatron_fixtures / "b_i32"), mmap=False)
    for i in (0, 17, 199):
        assert np.array_equal(mapped[i], unmapped[i])
        assert np.array_equal(mapped.get(i, 3, 4), unmapped.get(i, 3, 4))


# --- bad files: one clear error naming the file -------------------------------------------------


def _copy(megatron_fixtures, tmp_path, name="a_u16"):
    for ext in (".bin", ".idx"):
        shutil.copy(megatron_fixtures / f"{name}{ext}", tmp_path / f"{name}{ext}")
    return tmp_path / name


def _patch(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_bad_magic_version_dtype(megatron_fixtures, tmp_path):
    prefix = _copy(megatron_fixtures, tmp_path)
    idx = str(prefix) + ".idx"
    original = open(idx, "rb").read()
    for offset, data, message in [
        (0, b"NOTANIDX\x00", "bad magic"),
        (9, struct.pack("<Q", 2), "version 2"),
        (17, bytes([9]), "unknown dtype code 9"),
    ]:
        _patch(idx, offset, data)
        with pytest.raises(DataFileError, match=message) as err:
            IndexedDataset(str(prefix))
        assert idx in str(err.value) and "\n" not in str(err.value)
        open(idx, "wb").write(original)


def test_truncated_files(megatron_fixtures, tmp_path):
    prefix = _copy(megatron_fixtures, tmp_path)
    with open(str(prefix) + ".bin", "r+b") as f:
        f.truncate(1000)
    with pytest.raises(DataFileError, match=r"a_u16\.bin: shorter than its index says"):
        IndexedDataset(str(prefix))
    prefix = _copy(megatron_fixtures, tmp_path)
    with open(str(prefix) + ".idx", "r+b") as f:
        f.truncate(3000)
    with pytest.raises(DataFileError, match=r"a_u16\.idx: truncated index"):
        IndexedDataset(str(prefix))
    with open(str(prefix) + ".idx", "r+b") as f:
        f.truncate(20)
    with pytest.raises(DataFileError, match="truncated index"):
        IndexedDataset(str(prefix))


def test_missing_files(megatron_fixtures, tmp_path):
    prefix = _copy(megatron_fixtures, tmp_path)
    os.remove(str(prefix) + ".bin")
    with pytest.raises(DataFileNotFoundError, match=r"a_u16\.bin: not found"):
        IndexedDataset(str(prefix))
    with pytest.raises(FileNotFoundError):
        IndexedDataset(str(tmp_path / "nothing"))


def test_non_monotonic_pointers_and_document_index(megatron_fixtures, tmp_path):
    prefix = _copy(megatron_fixtures, tmp_path)
    idx = str(prefix) + ".idx"
    n = 300
    pointers_at = 34 + 4 * n
    ptr = np.frombuffer(open(idx, "rb").read()[pointers_at : pointers_at + 8 * n], dtype=np.int64).copy()
    ptr[[10, 11]] = ptr[[11, 10]]
    _patch(idx, pointers_at, ptr.tobytes())
    with pytest.raises(DataFileError, match="non-monotonic sequence pointers at sequence 11"):
        IndexedDataset(str(prefix))
    prefix = _copy(megatron_fixtures, tmp_path)
    docs_at = 34 + 12 * n
    _patch(idx, docs_at + 8 * 5, struct.pack("<q", 2))
    with pytest.raises(DataFileError, match="non-monotonic document index"):
        IndexedDataset(str(prefix))


def test_empty_documents_list(tmp_path):
    prefix = str(tmp_path / "empty")
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + bytes([8]) + struct.pack("<QQ", 0, 0))
    open(prefix + ".bin", "wb").close()
    with pytest.raises(DataFileError, match="empty documents list"):
        IndexedDataset(prefix)
    b = IndexedDatasetBuilder(str(tmp_path / "none.bin"), dtype=np.uint16)
    b.finalize(str(tmp_path / "none.idx"))
    with pytest.raises(DataFileError, match="contains no documents"):
        IndexedDataset(str(tmp_path / "none"))


def test_pickles_by_path(megatron_fixtures):
    import pickle

    ds = IndexedDataset(str(megatron_fixtures / "a_u16"))
    blob = pickle.dumps(ds)
    assert len(blob) < 500  # the path, not the mapping
    assert np.array_equal(pickle.loads(blob)[5], ds[5])
