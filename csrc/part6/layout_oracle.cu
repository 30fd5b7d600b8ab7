// CuTe's own answers for the layout algebra of snippets/part6/layout.py: a host-only program (no
// kernels) that applies CuTe's operations to a fixed list of static layouts and prints one line
// per case,
//
//   operation | argument | argument | result
//
// in CuTe's notation without the underscores of static integers: a layout is shape:stride, such
// as (4,(2,3)):(2,(1,8)); a tiler (a tuple of layouts, ints and _) is written <3:3,(2,4):(1,8)>;
// a swizzle is Sw<3,4,3>. tests/test_part6_layout.py builds it against CuTe's headers, parses
// every line, and checks that the book's Python gives the same result for the same arguments.
//
// Build: nvcc -std=c++17 -I<cutlass>/include -o layout_oracle csrc/part6/layout_oracle.cu
// (the include folder of CUTLASS 4.2, or cutlass_library/source/include in its Python wheel).
//
// Every integer is a compile-time constant (Int<N>), as in CuTe's documentation: with static
// shapes CuTe checks the divisibility conditions while compiling and coalesces size-1 modes,
// which is the behaviour the Python follows.

#include <cstdio>
#include <string>
#include <utility>

#if __has_include(<cute/layout.hpp>)

#include <cute/layout.hpp>
#include <cute/swizzle.hpp>

using namespace cute;

template <int N>
constexpr Int<N> c{};  // c<4> is the static integer _4

// Printing, in the notation Layout.__repr__ uses.

template <class T>
std::string str(T const& t);

template <class S, class D>
std::string str(Layout<S, D> const& layout) {
  return str(layout.shape()) + ":" + str(layout.stride());
}

template <int B, int M, int S>
std::string str(Swizzle<B, M, S> const&) {
  return "Sw<" + std::to_string(B) + "," + std::to_string(M) + "," + std::to_string(S) + ">";
}

template <class T, size_t... I>
std::string str_each(T const& t, std::index_sequence<I...>) {
  std::string s;
  ((s += (I == 0 ? "" : ",") + str(get<I>(t))), ...);
  return s;
}

template <class T>
std::string str(T const& t) {
  if constexpr (is_tuple<T>::value) {
    return "(" + str_each(t, std::make_index_sequence<tuple_size<T>::value>{}) + ")";
  } else if constexpr (is_underscore<T>::value) {
    return "_";
  } else {
    return std::to_string(int(t));
  }
}

// A tiler: a tuple of tilers is written <...> to tell it from a layout's shape.
template <class T>
std::string tiler(T const& t);

template <class T, size_t... I>
std::string tiler_each(T const& t, std::index_sequence<I...>) {
  std::string s;
  ((s += (I == 0 ? "" : ",") + tiler(get<I>(t))), ...);
  return s;
}

template <class T>
std::string tiler(T const& t) {
  if constexpr (is_tuple<T>::value) {
    return "<" + tiler_each(t, std::make_index_sequence<tuple_size<T>::value>{}) + ">";
  } else {
    return str(t);
  }
}

template <class... Args>
void line(char const* op, Args const&... args) {
  std::string s = op;
  ((s += std::string(" | ") + args), ...);
  std::printf("%s\n", s.c_str());
}

void print_layouts() {
  auto a = make_layout(make_shape(c<4>, make_shape(c<2>, c<3>)),
                       make_stride(c<2>, make_stride(c<1>, c<8>)));
  line("crd2idx", str(a), "13", str(a(13)));
  line("crd2idx", str(a), "(1,(1,2))", str(a(make_coord(1, make_coord(1, 2)))));
  line("crd2idx", str(a), "(3,5)", str(a(make_coord(3, 5))));  // 5 is a 1-D coordinate of (2,3)
  auto row = make_layout(make_shape(c<4>, c<8>), make_stride(c<8>, c<1>));
  line("crd2idx", str(row), "(1,2)", str(row(make_coord(1, 2))));
  line("crd2idx", str(row), "5", str(row(5)));
  auto blocked = make_layout(make_shape(make_shape(c<4>, c<2>), make_shape(c<4>, c<2>)),
                             make_stride(make_stride(c<1>, c<16>), make_stride(c<4>, c<32>)));
  line("crd2idx", str(blocked), "(5,6)", str(blocked(make_coord(5, 6))));
  line("crd2idx", str(blocked), "((1,1),(2,1))",
       str(blocked(make_coord(make_coord(1, 1), make_coord(2, 1)))));
  line("crd2idx", str(blocked), "77", str(blocked(77)));  // past the end: the last mode goes on

  auto gaps = make_layout(make_shape(c<3>, make_shape(c<2>, c<4>)),
                          make_stride(c<1>, make_stride(c<6>, c<12>)));
  auto broadcast = make_layout(make_shape(c<4>, c<8>), make_stride(c<0>, c<1>));
  auto column = make_layout(c<8>, c<32>);
  line("size", str(a), str(size(a)));
  line("cosize", str(a), str(cosize(a)));
  line("size", str(gaps), str(size(gaps)));
  line("cosize", str(gaps), str(cosize(gaps)));
  line("cosize", str(broadcast), str(cosize(broadcast)));
  line("cosize", str(column), str(cosize(column)));
  line("cosize", str(blocked), str(cosize(blocked)));

  // make_layout with CuTe's default (LayoutLeft) and LayoutRight strides
  auto left = make_layout(make_shape(c<4>, make_shape(c<1>, c<3>), c<2>));
  auto right = make_layout(make_shape(c<4>, make_shape(c<1>, c<3>), c<2>), LayoutRight{});
  line("make_layout", str(left.shape()), str(left));
  line("make_layout_row_major", str(right.shape()), str(right));
}

void print_coalesce() {
  auto a = make_layout(make_shape(c<2>, make_shape(c<1>, c<6>)),
                       make_stride(c<1>, make_stride(c<6>, c<2>)));
  line("coalesce", str(a), str(coalesce(a)));
  line("coalesce", str(a), "(1,1)", str(coalesce(a, make_tuple(c<1>, c<1>))));
  auto b = make_layout(make_shape(make_shape(c<2>, c<4>), make_shape(c<3>, c<2>)),
                       make_stride(make_stride(c<1>, c<2>), make_stride(c<8>, c<24>)));
  line("coalesce", str(b), str(coalesce(b)));
  line("coalesce", str(b), "(1,1)", str(coalesce(b, make_tuple(c<1>, c<1>))));
  auto row = make_layout(make_shape(c<4>, c<8>), make_stride(c<8>, c<1>));
  line("coalesce", str(row), str(coalesce(row)));
  auto ones = make_layout(make_shape(c<1>, c<1>), make_stride(c<3>, c<5>));
  line("coalesce", str(ones), str(coalesce(ones)));
  auto skip = make_layout(make_shape(c<4>, c<1>, c<2>), make_stride(c<1>, c<7>, c<4>));
  line("coalesce", str(skip), str(coalesce(skip)));
  auto zeros = make_layout(make_shape(c<2>, c<2>, c<3>), make_stride(c<0>, c<0>, c<1>));
  line("coalesce", str(zeros), str(coalesce(zeros)));
  auto nested = make_layout(
      make_shape(make_shape(make_shape(c<2>, c<2>), c<3>), make_shape(c<4>, c<2>)),
      make_stride(make_stride(make_stride(c<1>, c<2>), c<4>), make_stride(c<12>, c<48>)));
  line("coalesce", str(nested), str(coalesce(nested)));
  line("coalesce", str(nested), "((1,1),1)",
       str(coalesce(nested, make_tuple(make_tuple(c<1>, c<1>), c<1>))));
  line("coalesce", str(nested), "(1)", str(coalesce(nested, make_tuple(c<1>))));
}

void print_composition() {
  auto a = make_layout(make_shape(c<6>, c<2>), make_stride(c<8>, c<2>));
  auto b = make_layout(make_shape(c<4>, c<3>), make_stride(c<3>, c<1>));
  line("composition", str(a), str(b), str(composition(a, b)));
  auto a1 = make_layout(c<20>, c<2>);
  auto b1 = make_layout(make_shape(c<5>, c<4>), make_stride(c<4>, c<1>));
  line("composition", str(a1), str(b1), str(composition(a1, b1)));
  auto a2 = make_layout(make_shape(c<10>, c<2>), make_stride(c<16>, c<4>));
  auto b2 = make_layout(make_shape(c<5>, c<4>), make_stride(c<1>, c<5>));
  line("composition", str(a2), str(b2), str(composition(a2, b2)));
  auto a3 = make_layout(make_shape(c<12>, make_shape(c<4>, c<8>)),
                        make_stride(c<59>, make_stride(c<13>, c<1>)));
  auto t3 = make_tile(Layout<_3, _4>{}, Layout<_8, _2>{});
  line("composition", str(a3), tiler(t3), str(composition(a3, t3)));
  auto s3 = make_shape(c<3>, c<8>);
  line("composition", str(a3), tiler(s3), str(composition(a3, s3)));
  auto a4 = make_layout(make_shape(c<3>, c<6>, c<2>, c<8>),
                        make_stride(c<1>, c<5>, c<40>, c<97>));
  auto b4 = make_layout(c<16>, c<9>);
  line("composition", str(a4), str(b4), str(composition(a4, b4)));
  auto a5 = make_layout(make_shape(c<4>, c<6>, c<2>), make_stride(c<1>, c<4>, c<24>));
  auto t5 = make_tile(Layout<_2, _1>{}, Layout<_3, _2>{});  // mode 2 of a5 is dropped
  line("composition", str(a5), tiler(t5), str(composition(a5, t5)));
  auto a6 = make_layout(make_shape(c<4>, c<2>), make_stride(c<1>, c<8>));
  auto b6 = make_layout(c<16>, c<1>);  // past a6's size: its last mode goes on
  line("composition", str(a6), str(b6), str(composition(a6, b6)));
  auto a7 = make_layout(make_shape(c<4>, c<8>), make_stride(c<8>, c<1>));
  auto b7 = make_layout(make_shape(c<2>, c<4>), make_stride(c<0>, c<1>));
  line("composition", str(a7), str(b7), str(composition(a7, b7)));
  auto b8 = make_layout(make_shape(make_shape(c<2>, c<2>), c<4>),
                        make_stride(make_stride(c<1>, c<8>), c<2>));
  line("composition", str(a7), str(b8), str(composition(a7, b8)));
  auto a9 = make_layout(make_shape(c<16>, c<8>), make_stride(c<40>, c<1>));
  auto tv = make_layout(make_shape(make_shape(c<4>, c<8>), make_shape(c<2>, c<2>)),
                        make_stride(make_stride(c<32>, c<1>), make_stride(c<16>, c<8>)));
  line("composition", str(a9), str(tv), str(composition(a9, tv)));
  auto a10 = make_layout(make_shape(c<8>, c<8>), make_stride(c<8>, c<1>));
  line("composition", str(a10), "16", str(composition(a10, c<16>)));
  auto b11 = make_layout(make_shape(c<4>, c<2>), make_stride(c<1>, c<4>));
  line("composition", str(a10), str(b11), str(composition(a10, b11)));
  auto a12 = make_layout(make_shape(c<4>, c<1>), make_stride(c<1>, c<0>));
  auto b12 = make_layout(c<8>, c<1>);  // a12's last mode is 1:0, so 4..7 come back to 0
  line("composition", str(a12), str(b12), str(composition(a12, b12)));
  // Stride 3 does not divide the mode of size 4, but b's two elements stay inside that mode.
  auto a13 = make_layout(make_shape(c<4>, c<3>), make_stride(c<1>, c<8>));
  line("composition", str(a13), str(Layout<_2, _3>{}), str(composition(a13, Layout<_2, _3>{})));
  // CuTe's static check (3 is smaller than 4) accepts this one too, but its result is not a o b:
  // R(2) = 8 while a(b(2)) = a(6) = 10. The book refuses it; tests/test_part6_layout.py checks
  // both facts.
  line("composition", str(a13), str(Layout<_4, _3>{}), str(composition(a13, Layout<_4, _3>{})));
}

void print_complement() {
  line("complement", str(Layout<_4, _1>{}), "24", str(complement(Layout<_4, _1>{}, c<24>)));
  line("complement", str(Layout<_6, _4>{}), "24", str(complement(Layout<_6, _4>{}, c<24>)));
  auto a = make_layout(make_shape(c<4>, c<6>), make_stride(c<1>, c<4>));
  line("complement", str(a), "24", str(complement(a, c<24>)));
  line("complement", str(Layout<_4, _2>{}), "24", str(complement(Layout<_4, _2>{}, c<24>)));
  auto b = make_layout(make_shape(c<2>, c<4>), make_stride(c<1>, c<6>));
  line("complement", str(b), "24", str(complement(b, c<24>)));
  auto d = make_layout(make_shape(c<2>, c<2>), make_stride(c<1>, c<6>));
  line("complement", str(d), "24", str(complement(d, c<24>)));
  line("complement", str(d), str(complement(d)));  // up to the layout's own cosize
  auto shape = make_shape(c<6>, c<4>);  // a shape as cotarget: divided mode by mode
  line("complement", str(Layout<_4, _1>{}), str(shape),
       str(complement(Layout<_4, _1>{}, shape)));
  auto zeros = make_layout(make_shape(c<4>, c<2>), make_stride(c<0>, c<0>));
  line("complement", str(zeros), "12", str(complement(zeros, c<12>)));
  line("complement", str(Layout<_4, _2>{}), "4", str(complement(Layout<_4, _2>{}, c<4>)));
  auto holes = make_layout(make_shape(c<2>, c<2>), make_stride(c<1>, c<3>));
  line("complement", str(holes), "24", str(complement(holes, c<24>)));
  auto nested = make_layout(make_shape(c<2>, make_shape(c<2>, c<3>)),
                            make_stride(c<4>, make_stride(c<1>, c<16>)));
  line("complement", str(nested), "96", str(complement(nested, c<96>)));
}

void print_divide() {
  auto a = make_layout(make_shape(c<4>, c<2>, c<3>), make_stride(c<2>, c<1>, c<8>));
  line("logical_divide", str(a), str(Layout<_4, _2>{}),
       str(logical_divide(a, Layout<_4, _2>{})));
  auto m = make_layout(make_shape(c<9>, make_shape(c<4>, c<8>)),
                       make_stride(c<59>, make_stride(c<13>, c<1>)));
  auto t = make_tile(Layout<_3, _3>{}, Layout<Shape<_2, _4>, Stride<_1, _8>>{});
  line("logical_divide", str(m), tiler(t), str(logical_divide(m, t)));
  line("zipped_divide", str(m), tiler(t), str(zipped_divide(m, t)));
  line("tiled_divide", str(m), tiler(t), str(tiled_divide(m, t)));
  line("logical_divide", str(Layout<_16, _1>{}), "4", str(logical_divide(Layout<_16, _1>{}, c<4>)));
  line("logical_divide", str(Layout<_6, _1>{}), str(Layout<_4, _1>{}),
       str(logical_divide(Layout<_6, _1>{}, Layout<_4, _1>{})));  // 4 does not divide 6
  auto row = make_layout(make_shape(c<8>, c<8>), make_stride(c<8>, c<1>));
  line("logical_divide", str(row), tiler(make_shape(c<2>, c<4>)),
       str(logical_divide(row, make_shape(c<2>, c<4>))));
  auto col = make_layout(make_shape(c<8>, c<6>), make_stride(c<1>, c<8>));
  auto skip = make_tile(_, Layout<_3, _1>{});
  line("logical_divide", str(col), tiler(skip), str(logical_divide(col, skip)));
  auto odd = make_layout(make_shape(c<6>, c<4>), make_stride(c<1>, c<10>));  // coalesces to (6,4)
  line("logical_divide", str(odd), str(Layout<_3, _1>{}),
       str(logical_divide(odd, Layout<_3, _1>{})));
  // A tile of 4 in a mode of 6: CuTe accepts it, but the result is not odd o (4:1, 8:4), since
  // tile 1 would straddle the two modes. The book refuses it, as for composition above.
  line("logical_divide", str(odd), str(Layout<_4, _1>{}),
       str(logical_divide(odd, Layout<_4, _1>{})));
  auto big = make_layout(make_shape(c<256>, c<256>), make_stride(c<256>, c<1>));
  auto tile = make_shape(c<128>, c<128>);
  line("zipped_divide", str(big), tiler(tile), str(zipped_divide(big, tile)));
  auto cm = make_layout(make_shape(c<16>, c<16>), make_stride(c<1>, c<16>));
  auto two = make_shape(c<2>, c<2>);
  line("zipped_divide", str(cm), tiler(two), str(zipped_divide(cm, two)));
  line("zipped_divide", str(Layout<_24, _1>{}), str(Layout<_4, _2>{}),
       str(zipped_divide(Layout<_24, _1>{}, Layout<_4, _2>{})));
  auto cube = make_layout(make_shape(c<8>, c<8>, c<3>), make_stride(c<1>, c<8>, c<64>));
  auto t24 = make_shape(c<2>, c<4>);
  line("zipped_divide", str(cube), tiler(t24), str(zipped_divide(cube, t24)));
  line("tiled_divide", str(cube), tiler(t24), str(tiled_divide(cube, t24)));
  auto wide = make_layout(make_shape(c<16>, c<8>), make_stride(c<1>, c<16>));
  auto t4 = make_shape(c<4>);
  line("tiled_divide", str(wide), tiler(t4), str(tiled_divide(wide, t4)));
  line("tiled_divide", str(Layout<_24, _1>{}), str(Layout<_4, _1>{}),
       str(tiled_divide(Layout<_24, _1>{}, Layout<_4, _1>{})));
  auto nest = make_tile(make_tile(Layout<_2, _1>{}, Layout<_2, _1>{}), Layout<_4, _1>{});
  auto m2 = make_layout(make_shape(make_shape(c<4>, c<4>), c<8>),
                        make_stride(make_stride(c<1>, c<4>), c<16>));
  line("logical_divide", str(m2), tiler(nest), str(logical_divide(m2, nest)));
  line("zipped_divide", str(m2), tiler(nest), str(zipped_divide(m2, nest)));
}

void print_product() {
  auto a = make_layout(make_shape(c<2>, c<2>), make_stride(c<4>, c<1>));
  line("logical_product", str(a), str(Layout<_6, _1>{}),
       str(logical_product(a, Layout<_6, _1>{})));
  auto b = make_layout(make_shape(c<4>, c<2>), make_stride(c<2>, c<1>));
  line("logical_product", str(a), str(b), str(logical_product(a, b)));
  line("logical_product", str(Layout<_4, _1>{}), "3", str(logical_product(Layout<_4, _1>{}, c<3>)));
  line("logical_product", str(Layout<_4, _2>{}), str(Layout<_2, _1>{}),
       str(logical_product(Layout<_4, _2>{}, Layout<_2, _1>{})));
  auto rm = make_layout(make_shape(c<2>, c<5>), make_stride(c<5>, c<1>));
  auto bymode = make_tile(Layout<_3, _1>{}, Layout<_4, _1>{});
  line("logical_product", str(rm), tiler(bymode), str(logical_product(rm, bymode)));

  auto tile = make_layout(make_shape(c<2>, c<2>));
  auto grid = make_layout(make_shape(c<2>, c<3>));
  auto grid34 = make_layout(make_shape(c<3>, c<4>));
  auto one = Layout<_4, _1>{};
  auto nested = make_layout(make_shape(make_shape(c<2>, c<2>), c<2>),
                            make_stride(make_stride(c<1>, c<4>), c<2>));
  auto sq = make_layout(make_shape(c<2>, c<2>));
  line("blocked_product", str(tile), str(grid), str(blocked_product(tile, grid)));
  line("raked_product", str(tile), str(grid), str(raked_product(tile, grid)));
  line("blocked_product", str(rm), str(grid34), str(blocked_product(rm, grid34)));
  line("raked_product", str(rm), str(grid34), str(raked_product(rm, grid34)));
  line("blocked_product", str(one), str(grid), str(blocked_product(one, grid)));
  line("raked_product", str(one), str(grid), str(raked_product(one, grid)));
  line("blocked_product", str(one), str(Layout<_3, _1>{}),
       str(blocked_product(one, Layout<_3, _1>{})));
  line("raked_product", str(one), str(Layout<_3, _1>{}),
       str(raked_product(one, Layout<_3, _1>{})));
  line("blocked_product", str(nested), str(sq), str(blocked_product(nested, sq)));
  line("raked_product", str(nested), str(sq), str(raked_product(nested, sq)));
  line("blocked_product", str(grid), str(one), str(blocked_product(grid, one)));
  auto gapped = Layout<_4, _2>{};  // a block with holes: its copies fill them
  line("blocked_product", str(gapped), str(grid), str(blocked_product(gapped, grid)));
  line("raked_product", str(gapped), str(grid), str(raked_product(gapped, grid)));
  line("logical_product", str(gapped), str(grid), str(logical_product(gapped, grid)));
  line("blocked_product", str(Layout<_3, _2>{}), str(one),
       str(blocked_product(Layout<_3, _2>{}, one)));
}

void print_inverse() {
  auto row = make_layout(make_shape(c<4>, c<8>), make_stride(c<8>, c<1>));
  auto blocked = make_layout(make_shape(make_shape(c<2>, c<2>), make_shape(c<2>, c<2>)),
                             make_stride(make_stride(c<1>, c<4>), make_stride(c<2>, c<8>)));
  auto gap = make_layout(make_shape(c<4>, c<2>), make_stride(c<1>, c<8>));
  auto bcast = make_layout(make_shape(c<4>, c<2>), make_stride(c<1>, c<0>));
  auto mixed = make_layout(make_shape(c<3>, make_shape(c<2>, c<4>)),
                           make_stride(c<2>, make_stride(c<1>, c<6>)));
  auto spaced = make_layout(make_shape(c<2>, c<4>), make_stride(c<1>, c<6>));
  auto tv = make_layout(make_shape(make_shape(c<4>, c<8>), make_shape(c<2>, c<2>)),
                        make_stride(make_stride(c<32>, c<1>), make_stride(c<16>, c<8>)));
  line("right_inverse", str(row), str(right_inverse(row)));
  line("right_inverse", str(blocked), str(right_inverse(blocked)));
  line("right_inverse", str(gap), str(right_inverse(gap)));
  line("right_inverse", str(bcast), str(right_inverse(bcast)));
  line("right_inverse", str(mixed), str(right_inverse(mixed)));
  line("right_inverse", str(Layout<_4, _2>{}), str(right_inverse(Layout<_4, _2>{})));
  line("right_inverse", str(tv), str(right_inverse(tv)));
  line("left_inverse", str(row), str(left_inverse(row)));
  line("left_inverse", str(blocked), str(left_inverse(blocked)));
  line("left_inverse", str(gap), str(left_inverse(gap)));
  line("left_inverse", str(bcast), str(left_inverse(bcast)));
  line("left_inverse", str(mixed), str(left_inverse(mixed)));
  line("left_inverse", str(Layout<_4, _2>{}), str(left_inverse(Layout<_4, _2>{})));
  line("left_inverse", str(spaced), str(left_inverse(spaced)));
  line("left_inverse", str(tv), str(left_inverse(tv)));

  auto col = make_layout(make_shape(c<4>, c<8>), make_stride(c<1>, c<4>));
  auto strided = make_layout(make_shape(c<8>, c<4>), make_stride(c<1>, c<16>));
  auto eight = make_layout(make_shape(c<8>, c<4>), make_stride(c<1>, c<8>));
  line("max_common_vector", str(col), str(col), str(max_common_vector(col, col)));
  line("max_common_vector", str(row), str(col), str(max_common_vector(row, col)));
  line("max_common_vector", str(eight), str(strided), str(max_common_vector(eight, strided)));
}

void print_swizzle() {
  Swizzle<3, 4, 3> sw128;
  for (int offset : {0, 16, 48, 128, 144, 400, 1000, 1023, 1024, 1936}) {
    line("swizzle", str(sw128), std::to_string(offset), std::to_string(sw128(offset)));
  }
  Swizzle<3, 3, 3> sw64;
  Swizzle<2, 4, 3> sw2;
  Swizzle<2, 4, -3> neg;
  for (int offset : {5, 77, 300, 511, 1000}) {
    line("swizzle", str(sw64), std::to_string(offset), std::to_string(sw64(offset)));
    line("swizzle", str(sw2), std::to_string(offset), std::to_string(sw2(offset)));
    line("swizzle", str(neg), std::to_string(offset), std::to_string(neg(offset)));
  }
}

int main() {
  print_layouts();
  print_coalesce();
  print_composition();
  print_complement();
  print_divide();
  print_product();
  print_inverse();
  print_swizzle();
  return 0;
}

#else  // built without CuTe on the include path (csrc/'s compile test builds every file)

int main() {
  std::fprintf(stderr, "layout_oracle needs CuTe's headers: nvcc -std=c++17 -I<cutlass>/include\n");
  return 2;
}

#endif
