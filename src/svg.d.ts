// SVG files are bundled as raw strings (the labextension builder's asset/source rule for .js issuers).
declare module '*.svg' {
  const value: string;
  export default value;
}
