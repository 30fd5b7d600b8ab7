// A tour of cute::Tensor on the CPU: a host-only program (no kernel, no GPU) that makes tensors
// over a host array and prints what make_tensor, local_tile and local_partition give. The CuTe
// GEMM chapter (docs/part6/cute-gemm.md) shows its regions and its output, which is committed as
// docs/part6/tensor_tour.out.txt. tests/test_part6_cute_tensor.py builds it against CuTe's
// headers, checks every element and every owner it prints against the book's Python layout
// algebra (snippets/part6/layout.py), and checks that the committed output is what it prints.
//
// Build: nvcc -std=c++17 -I<cutlass>/include -o tensor_tour csrc/cute/tensor_tour.cu
// (the include folder of CUTLASS 4.2, or cutlass_library/source/include in its Python wheel).
//
// Output: blocks, each headed "== name: layout at offset N" (the layout in CuTe's notation, where
// _4 is a compile-time 4 and 4 a run-time one; N is where the tensor's first element lies in the
// array), then the rows of a matrix: values alone, or (row,col)=value, with the element's
// coordinate in the 8 x 12 matrix read from an identity tensor cut up the same way. The array
// holds 0, 1, ..., 95, so an element's value is also its offset in the array.

#include <cstdio>
#include <string>

#if __has_include(<cute/tensor.hpp>)

#include <cute/tensor.hpp>

using namespace cute;

// "== name: layout at offset N": N is where the tensor's first element lies in the array.
template <class T>
void header(std::string const& name, T const& t, int const* base) {
  std::printf("== %s: ", name.c_str());
  print(t.layout());
  std::printf(" at offset %d\n", int(&t(0) - base));
}

// A rank-2 tensor, row by row, its values alone.
template <class T>
void show(std::string const& name, T const& t, int const* base) {
  header(name, t, base);
  for (int i = 0; i < size<0>(t); ++i) {
    for (int j = 0; j < size<1>(t); ++j) std::printf("%4d", int(t(i, j)));
    std::printf("\n");
  }
}

// A rank-2 tensor, row by row, each value with the (row, col) that `coords` holds at its place.
template <class T, class C>
void show(std::string const& name, T const& t, C const& coords, int const* base) {
  header(name, t, base);
  for (int i = 0; i < size<0>(t); ++i) {
    for (int j = 0; j < size<1>(t); ++j) {
      char cell[32];
      std::snprintf(cell, sizeof cell, "(%d,%d)=%d", int(get<0>(coords(i, j))),
                    int(get<1>(coords(i, j))), int(t(i, j)));
      std::printf(j + 1 < size<1>(t) ? "%-11s" : "%s\n", cell);
    }
  }
}

int main() {
  // --8<-- [start:make_tensor]
  int const M = 8, N = 12;                    // run-time sizes, like the GEMM's M and N
  int a[M * N];
  for (int i = 0; i < M * N; ++i) a[i] = i;  // each element holds its own offset

  // A pointer and a layout. make_gmem_ptr tags the pointer as global memory (on the host it is
  // only a tag). (M,N):(N,1) is row-major: element (i, j) is a[i * N + j].
  Tensor A = make_tensor(make_gmem_ptr(a), make_shape(M, N), make_stride(N, _1{}));
  show("A, row-major", A, a);

  // The same array with other layouts. Without a stride the layout is column-major, as in the
  // Python: element (i, j) is a[i + j * M].
  Tensor B = make_tensor(make_gmem_ptr(a), make_shape(M, N));
  show("B, column-major", B, a);
  // Hierarchical: rows as (4 in a block, 2 blocks), columns as (4 in a block, 3 blocks), each
  // 4 x 4 block 16 contiguous elements (column-major), the blocks column-major too.
  auto blocked = make_layout(make_shape (make_shape (_4{}, _2{}), make_shape (_4{}, _3{})),
                             make_stride(make_stride(_1{}, _16{}), make_stride(_4{}, _32{})));
  Tensor H = make_tensor(make_gmem_ptr(a), blocked);
  show("H, blocked", H, a);
  // A coordinate at any depth: row 5 is row 1 of row-block 1, column 6 column 2 of block 1.
  std::printf("A(5,6) = %d, B(5,6) = %d, H(5,6) = %d, H((1,1),(2,1)) = %d\n\n", int(A(5, 6)),
              int(B(5, 6)), int(H(5, 6)), int(H(make_coord(make_coord(1, 1), make_coord(2, 1)))));
  // --8<-- [end:make_tensor]

  // --8<-- [start:local_tile]
  auto tiler = make_shape(_4{}, _4{});                   // 4 x 4 tiles
  Tensor tiled = zipped_divide(A, tiler);                // ((4,4),(2,3)): (element, tile)
  Tensor T = local_tile(A, tiler, make_coord(1, 2));     // (4,4): tile row 1, tile column 2
  Tensor all = local_tile(A, tiler, make_coord(_, _));   // (4,4,2,3): every tile at once
  header("zipped_divide(A, (4,4))", tiled, a);
  header("local_tile(A, (4,4), (_,_))", all, a);
  header("all(_,_,1,2)", all(_, _, 1, 2), a);           // _ keeps a mode: tile (1,2), T again

  // An identity tensor holds coordinates instead of values: (i, j) at (i, j). Cut up the same
  // way, it says where in A each element of a tile comes from.
  Tensor I = make_identity_tensor(shape(A));             // (8,12) -> (i, j)
  Tensor cT = local_tile(I, tiler, make_coord(1, 2));
  show("local_tile(A, (4,4), (1,2))", T, cT, a);
  // The same tile of the blocked tensor H is one contiguous run of 16.
  show("local_tile(H, (4,4), (1,2))", local_tile(H, tiler, make_coord(1, 2)), cT, a);
  std::printf("\n");
  // --8<-- [end:local_tile]

  // --8<-- [start:local_partition]
  auto threads = make_layout(make_shape(_2{}, _2{}), LayoutRight{});  // (2,2):(2,1)
  for (int t = 0; t < size(threads); ++t) {
    Tensor tT = local_partition(T, threads, t);    // (2,2): the elements thread t owns
    Tensor tcT = local_partition(cT, threads, t);  // and where they are in A
    show("local_partition(T, threads, " + std::to_string(t) + ")", tT, tcT, a);
  }
  // --8<-- [end:local_partition]
  return 0;
}

#else  // built without CuTe on the include path (csrc/'s compile test builds every file)

int main() {
  std::fprintf(stderr, "tensor_tour needs CuTe's headers: nvcc -std=c++17 -I<cutlass>/include\n");
  return 2;
}

#endif
